// The export formats: graph JSON and params (safetensors) round trips, byte compatibility with
// the Python writer, and the exact diagnostics of every malformed input. Atomic writes:
// test_atomic_file.cc.
#include <unistd.h>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/ir/serialize.h"
#include "test_util.h"

namespace kiln::ir {
namespace {

namespace fs = std::filesystem;
using testing::ReadAll;
using testing::TempDir;
using Ints = std::vector<int64_t>;

// A small MLP (matmul/add/relu) with attributes of every kind and a multi-output split.
struct Mlp {
  Graph g;
  GraphManifest m;
  Mlp() {
    Builder b(g);
    Value* x = g.AddInput("data", {{2, 8}, DType::kFloat32});
    Value* w0 = g.AddInput("0.weight", {{8, 16}, DType::kFloat32});
    Value* b0 = g.AddInput("0.bias", {{16}, DType::kFloat32});
    Value* w1 = g.AddInput("1.weight", {{4, 16}, DType::kFloat32});
    Value* b1 = g.AddInput("1.bias", {{4}, DType::kFloat32});
    Value* h = b.Op("relu", {b.Add(b.Op("matmul", {x, w0}), b0)});
    Value* y = b.Add(b.Op("matmul", {h, w1}, {{"transpose_b", true}}), b1); // bool
    std::vector<Value*> parts =
        b.OpN("split", {y}, {{"sections", Ints{2}}, {"axis", int64_t{1}}}); // ints, int
    Value* s = b.Op("sum", {parts[0]}, {{"axes", Ints{1}}, {"keepdims", true}});
    Value* scale = b.Op("full", {}, {{"shape", Ints{}}, {"value", 0.1}}); // float
    Value* half = b.Op("cast", {parts[1]}, {{"dtype", DType::kFloat16}}); // dtype
    g.SetOutputs({b.Mul(s, scale), half, parts[0]});
    m.inputs = {"data"};
    m.params = {"0.weight", "0.bias", "1.weight", "1.bias"};
    m.output_structure =
        OutputStructure::List({OutputStructure::Leaf(0),
                               OutputStructure::List({OutputStructure::Leaf(1), OutputStructure::Leaf(2)})});
  }
};

std::string MlpJson() {
  Mlp mlp;
  return GraphToJson(mlp.g, mlp.m);
}

// `text` with the one occurrence of `from` replaced by `to`.
std::string Edit(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "not in the document: " << from);
  REQUIRE_MESSAGE(text.find(from, at + 1) == std::string::npos, "more than once in the document: " << from);
  return text.replace(at, from.size(), to);
}

std::string GraphError(const std::string& text) {
  try {
    GraphFromJson(text);
  } catch (const FormatError& e) {
    return e.what();
  }
  FAIL("no FormatError for:\n" << text);
  return "";
}

void ExpectGraphError(const std::string& text, const std::string& key) {
  std::string msg = GraphError(text);
  CHECK_MESSAGE(msg.find(key) != std::string::npos, "expected \"" << key << "\" in: " << msg);
}



void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

// --- graph JSON ----------------------------------------------------------------------------------

TEST_CASE("format: graph json round trip is identical") {
  Mlp mlp;
  std::string text = GraphToJson(mlp.g, mlp.m);
  LoadedGraph loaded = GraphFromJson(text);
  CHECK(GraphToJson(*loaded.graph, loaded.manifest) == text);
  CHECK(loaded.manifest == mlp.m);
  CHECK(loaded.graph->str() == mlp.g.str()); // inputs come first in both, so the ids agree
  for (size_t i = 0; i < mlp.g.nodes().size(); ++i)
    CHECK(loaded.graph->nodes()[i]->attrs() == mlp.g.nodes()[i]->attrs());
  CHECK(loaded.graph->inputs()[0]->name() == "data");
  CHECK(loaded.graph->inputs()[1]->name() == "0.weight");
  // The document layout (see serialize.h): values numbered densely, inputs and params first.
  CHECK(
      text.find(
          R"({"op":"split","inputs":[9],"attrs":{"sections":[2],"axis":1},"outputs":[)"
          R"({"value":10,"dtype":"float32","shape":[2,2]},{"value":11,"dtype":"float32","shape":[2,2]}]})") !=
      std::string::npos);
  CHECK(text.find(R"("attrs":{"shape":[],"value":0.1,"dtype":"float32"})") != std::string::npos);
  CHECK(text.find("\"output_structure\": [0,[1,2]]\n}\n") != std::string::npos);
}

TEST_CASE("format: graph json renumbers interleaved inputs and keeps non-finite floats") {
  Graph g;
  Builder b(g);
  Value* x = g.AddInput("x", {{3}, DType::kFloat64});
  Value* inf = b.Op("full", {}, {{"shape", Ints{3}}, {"value", HUGE_VAL}, {"dtype", DType::kFloat64}});
  Value* w = g.AddInput("w", {{3}, DType::kFloat64}); // a param met after a node, as a tracer does
  Value* nan = b.Op("full", {}, {{"shape", Ints{}}, {"value", std::nan("")}, {"dtype", DType::kFloat64}});
  Value* y = b.Add(b.Mul(x, w), b.Add(inf, nan));
  g.SetOutputs({y});
  GraphManifest m{{"data"}, {"weight"}, OutputStructure::Leaf(0)};
  std::string text = GraphToJson(g, m);
  CHECK(text.find(R"("value":"inf")") != std::string::npos);
  CHECK(text.find(R"("value":"nan")") != std::string::npos);
  CHECK(text.find(R"({"op":"mul","inputs":[0,1])") != std::string::npos);
  CHECK(text.find("\"output_structure\": 0\n") != std::string::npos);
  LoadedGraph loaded = GraphFromJson(text);
  CHECK(loaded.graph->inputs()[1]->name() == "weight"); // the manifest names the inputs
  CHECK(GraphToJson(*loaded.graph, loaded.manifest) == text);
  CHECK(std::isinf(loaded.graph->nodes()[0]->attrs().Float("value")));
  CHECK(std::isnan(loaded.graph->nodes()[1]->attrs().Float("value")));

  // An omitted attribute takes the op's default.
  LoadedGraph defaults = GraphFromJson(
      Edit(text, R"("shape":[3],"value":"inf","dtype":"float64")", R"("shape":[3],"dtype":"float64")"));
  CHECK(defaults.graph->nodes()[0]->attrs().Float("value") == 0.0);
}

TEST_CASE("format: graph json save and load a file") {
  TempDir dir("kiln_formats");
  Mlp mlp;
  SaveGraph(dir / "mlp-symbol.json", mlp.g, mlp.m);
  LoadedGraph loaded = LoadGraph(dir / "mlp-symbol.json");
  CHECK(loaded.manifest == mlp.m);
  WriteRaw(dir / "bad-symbol.json", "[]");
  CHECK_THROWS_WITH_AS(
      LoadGraph(dir / "bad-symbol.json"),
      doctest::Contains("bad-symbol.json': the document: expected an object, found an array []"),
      FormatError);
  CHECK_THROWS_WITH_AS(LoadGraph(dir / "none.json"), doctest::Contains("cannot open"), FormatError);
}

TEST_CASE("format: graph json rejects bad documents with exact messages") {
  const std::string ok = MlpJson();
  SUBCASE("not JSON, with its position") {
    ExpectGraphError("{\"format\": \"kiln-graph\",\n  \"version\": }", "not valid JSON at line 2, column 14");
  }
  SUBCASE("a repeated key") {
    ExpectGraphError(Edit(ok, "\"version\": 1,", "\"version\": 1, \"version\": 1,"),
                     "the key \"version\" appears twice in one object");
  }
  SUBCASE("wrong format") {
    ExpectGraphError(
        Edit(ok, "\"kiln-graph\"", "\"kiln-graf\""),
        "\"format\": expected \"kiln-graph\", found a string \"kiln-graf\"; this is not a kiln graph file");
  }
  SUBCASE("newer version") {
    ExpectGraphError(Edit(ok, "\"version\": 1", "\"version\": 7"),
                     "version 7 is newer than this kiln (1); upgrade kiln");
  }
  SUBCASE("version not an integer") {
    ExpectGraphError(Edit(ok, "\"version\": 1", "\"version\": \"1\""),
                     "\"version\": expected an integer, found a string \"1\"");
  }
  SUBCASE("older version with no upgrade") {
    ExpectGraphError(Edit(ok, "\"version\": 1", "\"version\": 0"),
                     "version 0 is older than any this kiln can read or upgrade (oldest: 1)");
  }
  SUBCASE("missing field") {
    ExpectGraphError(Edit(ok, ",\n  \"output_structure\": [0,[1,2]]", ""),
                     "the document: missing key \"output_structure\"");
    ExpectGraphError(Edit(ok, R"({"op":"relu","inputs":[6],"attrs":{},)", R"({"op":"relu","inputs":[6],)"),
                     "nodes[2] (relu): missing key \"attrs\"");
  }
  SUBCASE("unknown key") {
    ExpectGraphError(
        Edit(ok, "\"version\": 1,", "\"version\": 1, \"extra\": 1,"),
        "the document: unknown key \"extra\" (expected the keys format, version, inputs, params, nodes, "
        "outputs, output_structure)");
  }
  SUBCASE("unknown op, with the closest name") {
    ExpectGraphError(Edit(ok, "\"op\":\"relu\"", "\"op\":\"rellu\""),
                     "nodes[2]: unknown op \"rellu\"; did you mean \"relu\"?");
  }
  SUBCASE("attribute of the wrong kind") {
    ExpectGraphError(Edit(ok, "\"transpose_b\":true", "\"transpose_b\":\"yes\""),
                     "nodes[3] (matmul): attribute \"transpose_b\" expects a bool, found a string \"yes\"");
    ExpectGraphError(Edit(ok, "\"sections\":[2]", "\"sections\":[2.5]"),
                     "nodes[5] (split): attribute \"sections\" expects an int list, found an array [2.5]");
    ExpectGraphError(Edit(ok, "\"axis\":1", "\"axis\":true"),
                     "nodes[5] (split): attribute \"axis\" expects an int, found a bool true");
    ExpectGraphError(Edit(ok, "\"value\":0.1", "\"value\":[0.1]"),
                     "nodes[7] (full): attribute \"value\" expects a float");
    ExpectGraphError(
        Edit(ok, "\"attrs\":{\"dtype\":\"float16\"}", "\"attrs\":{\"dtype\":\"flaot16\"}"),
        "nodes[8] (cast): attribute \"dtype\" expects a dtype name (float32, float64, float16, bfloat16, "
        "int32, int64, uint8, bool), found a string \"flaot16\"");
  }
  SUBCASE("attribute unknown to the op") {
    ExpectGraphError(Edit(ok, "\"keepdims\":true", "\"keepdims\":true,\"keepdim\":true"),
                     "nodes[6] (sum): unknown attribute \"keepdim\"; sum takes axes, keepdims");
  }
  SUBCASE("reference to an undefined value") {
    ExpectGraphError(Edit(ok, "\"inputs\":[12,13]", "\"inputs\":[12,16]"),
                     "nodes[9] (mul): input 1 refers to value 16, which is not defined before this node "
                     "(values 0..14 are)");
    ExpectGraphError(
        Edit(ok, "\"inputs\":[5,2]", "\"inputs\":[5,7]"),
        "nodes[1] (add): input 1 refers to value 7, which is not defined before this node (values 0..5 are)");
    ExpectGraphError(Edit(ok, "\"inputs\":[5,2]", "\"inputs\":[5,-1]"), "input 1 refers to value -1");
  }
  SUBCASE("recorded type disagrees with inference") {
    ExpectGraphError(
        Edit(ok, R"({"value":12,"dtype":"float32","shape":[2,1]})",
             R"({"value":12,"dtype":"float32","shape":[2]})"),
        "nodes[6] (sum): output 0 is recorded as float32(2,) but sum infers float32(2, 1) from its inputs");
    ExpectGraphError(Edit(ok, R"({"value":14,"dtype":"float16","shape":[2,2]}]})",
                          R"({"value":14,"dtype":"bfloat16","shape":[2,2]}]})"),
                     "nodes[8] (cast): output 0 is recorded as bfloat16(2, 2) but cast infers float16(2, 2)");
    ExpectGraphError(Edit(ok, R"(    {"value":14,"dtype":"float16","shape":[2,2]},)",
                          R"(    {"value":14,"dtype":"float16","shape":[2,3]},)"),
                     "outputs[1]: is recorded as float16(2, 3) but value 14 is float16(2, 2)");
  }
  SUBCASE("inputs the op rejects, and output counts") {
    ExpectGraphError(Edit(ok, "\"inputs\":[0,1]", "\"inputs\":[0,2]"),
                     "nodes[0] (matmul): the op rejects its recorded inputs or attributes: matmul");
    ExpectGraphError(Edit(ok, "\"sections\":[2]", "\"sections\":[4]"),
                     "nodes[5] (split): records 2 output(s) but split with sections=[4], axis=1 makes 4");
    ExpectGraphError(Edit(ok, "{\"value\":5,", "{\"value\":6,"),
                     "nodes[0] (matmul).outputs[0].value: expected 5, found 6 (values are numbered densely");
  }
  SUBCASE("duplicated names") {
    ExpectGraphError(Edit(ok, "{\"name\":\"1.bias\"", "{\"name\":\"0.bias\""),
                     "params[3].name: \"0.bias\" is used twice (also by params[1]); names must be unique");
    ExpectGraphError(Edit(ok, "{\"name\":\"0.weight\"", "{\"name\":\"data\""),
                     "\"data\" is used twice (also by inputs[0])");
  }
  SUBCASE("bad input entries") {
    ExpectGraphError(Edit(ok, "\"shape\":[4,16]}", "\"shape\":[4,-16]}"),
                     "params[2].shape[1]: expected a size >= 0, found -16");
    ExpectGraphError(Edit(ok, "\"shape\":[4,16]}", "\"shape\":[1,1,1,1,1,1,1,1,1]}"),
                     "params[2].shape: rank 9 exceeds kiln's maximum of 8");
    ExpectGraphError(
        Edit(ok, "{\"name\":\"1.bias\",\"dtype\":\"float32\"", "{\"name\":\"1.bias\",\"dtype\":\"f32\""),
        "params[3].dtype: unknown dtype \"f32\"");
  }
  SUBCASE("outputs and their structure") {
    ExpectGraphError(Edit(ok, R"({"value":15,"dtype":"float32","shape":[2,1]},)",
                          R"({"value":99,"dtype":"float32","shape":[2,1]},)"),
                     "outputs[0]: refers to value 99, which is not defined (values 0..15 are)");
    ExpectGraphError(Edit(ok, "[0,[1,2]]", "[0,[1]]"),
                     "output_structure: does not contain output 2; every output must appear in it");
    ExpectGraphError(Edit(ok, "[0,[1,2]]", "[0,[1,5]]"),
                     "output_structure: refers to output 5 but the graph has 3");
    ExpectGraphError(Edit(ok, "[0,[1,2]]", "[0,[1,\"2\"]]"),
                     "output_structure[1][1]: expected an integer, found a string \"2\"");
    ExpectGraphError(Edit(ok, "[0,[1,2]]", "[0,1,2," + std::string(100, '[') + std::string(100, ']') + "]"),
                     "lists nested more than 64 deep");
  }
  SUBCASE("every message says what to do") {
    CHECK(GraphError(Edit(ok, "\"op\":\"relu\"", "\"op\":\"rellu\"")).find("export the model again") !=
          std::string::npos);
  }
}

TEST_CASE("format: graph json upgrades an older version in one place") {
  // A synthetic version 0 that called "nodes" "ops": the upgrade renames it and the rest of the
  // loader only ever sees the current version.
  detail::SetGraphUpgradeForTesting(0, [](const std::string& doc) {
    std::string up = doc;
    size_t at = up.find("\"ops\":");
    REQUIRE(at != std::string::npos);
    return up.replace(at, 6, "\"nodes\":");
  });
  std::string ok = MlpJson();
  std::string v0 = Edit(Edit(ok, "\"version\": 1", "\"version\": 0"), "\"nodes\":", "\"ops\":");
  LoadedGraph loaded = GraphFromJson(v0);
  CHECK(GraphToJson(*loaded.graph, loaded.manifest) == ok);
  detail::SetGraphUpgradeForTesting(0, nullptr);
  ExpectGraphError(v0, "version 0 is older than any this kiln can read or upgrade");
}

TEST_CASE("format: graph json writer checks the manifest") {
  Mlp mlp;
  GraphManifest m = mlp.m;
  m.params.pop_back();
  CHECK_THROWS_WITH_AS(GraphToJson(mlp.g, m),
                       doctest::Contains("names 1 input(s) and 3 param(s) but the graph has 5 inputs"),
                       ValueError);
  m = mlp.m;
  m.output_structure = OutputStructure::Flat(2);
  CHECK_THROWS_WITH_AS(GraphToJson(mlp.g, m),
                       doctest::Contains("the output structure does not contain output 2"), ValueError);
  m = mlp.m;
  m.params[1] = "0.weight";
  CHECK_THROWS_WITH_AS(GraphToJson(mlp.g, m), doctest::Contains("the name \"0.weight\" is used twice"),
                       ValueError);
}

// --- params --------------------------------------------------------------------------------------

HostTensor Patterned(DType dtype, const Shape& shape) {
  HostTensor t{dtype, shape, std::vector<uint8_t>(shape.numel() * DTypeSize(dtype))};
  for (size_t i = 0; i < t.bytes.size(); ++i)
    t.bytes[i] = dtype == DType::kBool ? i % 2 : static_cast<uint8_t>(i * 37 + 11);
  return t;
}

TEST_CASE("format: params round trip every dtype, 0-d and empty tensors") {
  TempDir dir("kiln_formats");
  std::vector<NamedHostTensor> params;
  for (int d = 0; d < kNumDTypes; ++d) {
    DType dtype = static_cast<DType>(d);
    params.emplace_back(std::string(DTypeName(dtype)) + ".matrix", Patterned(dtype, {3, 5}));
    params.emplace_back(std::string(DTypeName(dtype)) + ".scalar", Patterned(dtype, {}));
    params.emplace_back(std::string(DTypeName(dtype)) + ".empty", Patterned(dtype, {0, 4}));
  }
  SaveParams(dir / "m-0000.params", params);
  std::map<std::string, std::string> metadata;
  std::vector<NamedHostTensor> loaded = LoadParams(dir / "m-0000.params", &metadata);
  CHECK(loaded == params); // names, order, dtypes, shapes and bytes
  CHECK(metadata == std::map<std::string, std::string>{{"format", "kiln"}});
  std::string blob = ReadAll(dir / "m-0000.params");
  CHECK(static_cast<uint8_t>(blob[0]) % 8 == 0); // the data starts 8-byte aligned
  CHECK(dir.Names() == std::vector<std::string>{"m-0000.params"});

  SaveParams(dir / "none.params", {});
  CHECK(LoadParams(dir / "none.params").empty());
}

// The bytes python/kiln/nn/serialization.py writes for {"w": float32 [1, -2], "café": bfloat16
// 1.5, "e": int64 (0, 3)} with metadata {"format": "kiln"}: json.dumps(separators=(",", ":"))
// escapes non-ASCII, and spaces pad the header to 208 = 0xd0 bytes.
const std::string kPythonHeader =
    R"({"__metadata__":{"format":"kiln"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
    R"("caf\u00e9":{"dtype":"BF16","shape":[],"data_offsets":[8,10]},)"
    R"("e":{"dtype":"I64","shape":[0,3],"data_offsets":[10,10]}}  )";

std::string PythonFile() {
  std::string blob("\xd0\0\0\0\0\0\0\0", 8);
  blob += kPythonHeader;
  blob += std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8); // 1.0f, -2.0f
  blob += std::string("\xc0\x3f", 2);                         // bfloat16 1.5
  return blob;
}

std::vector<NamedHostTensor> PythonTensors() {
  return {{"w", {DType::kFloat32, {2}, {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}}},
          {"caf\xc3\xa9", {DType::kBFloat16, {}, {0xc0, 0x3f}}},
          {"e", {DType::kInt64, {0, 3}, {}}}};
}

TEST_CASE("format: params are byte-compatible with the Python writer") {
  TempDir dir("kiln_formats");
  REQUIRE(kPythonHeader.size() == 0xd0);
  SaveParams(dir / "cpp.params", PythonTensors());
  CHECK(ReadAll(dir / "cpp.params") == PythonFile());
  WriteRaw(dir / "py.params", PythonFile());
  std::vector<NamedHostTensor> loaded = LoadParams(dir / "py.params");
  CHECK(loaded == PythonTensors());
  float w[2];
  std::memcpy(w, loaded[0].second.bytes.data(), 8);
  CHECK(w[0] == 1.0f);
  CHECK(w[1] == -2.0f);
  BFloat16 c;
  std::memcpy(&c.bits, loaded[1].second.bytes.data(), 2);
  CHECK(static_cast<float>(c) == 1.5f);
}

TEST_CASE("format: params writer rejects inconsistent tensors") {
  TempDir dir("kiln_formats");
  CHECK_THROWS_WITH_AS(
      SaveParams(dir / "a.params", {{"w", {DType::kFloat32, {2, 3}, std::vector<uint8_t>(20)}}}),
      doctest::Contains("tensor 'w' of type float32(2, 3) needs 24 bytes but holds 20"), ValueError);
  CHECK_THROWS_WITH_AS(SaveParams(dir / "a.params", {{"w", Patterned(DType::kUInt8, {1})},
                                                     {"w", Patterned(DType::kUInt8, {1})}}),
                       doctest::Contains("the name 'w' is used twice"), ValueError);
  CHECK(dir.Names().empty());
}

// A params file from a header text and data bytes (no padding: readers do not require it).
std::string Blob(const std::string& header, const std::string& data) {
  std::string blob(8, '\0');
  for (int i = 0; i < 8; ++i) blob[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return blob + header + data;
}

TEST_CASE("format: params reader rejects malformed files with exact messages") {
  TempDir dir("kiln_formats");
  auto expect = [&](const std::string& bytes, const std::string& key) {
    WriteRaw(dir / "bad.params", bytes);
    std::string msg;
    try {
      LoadParams(dir / "bad.params");
    } catch (const FormatError& e) {
      msg = e.what();
    }
    CHECK_MESSAGE(msg.find(key) != std::string::npos, "expected \"" << key << "\" in: " << msg);
    CHECK_MESSAGE(msg.find("bad.params'") != std::string::npos, msg);
  };
  const std::string f32 = std::string(8, '\1');
  SUBCASE("too short") {
    expect("abc",
           "is not a safetensors file: expected at least an 8-byte header length, found a file of 3 bytes");
  }
  SUBCASE("header length beyond the file") {
    expect(Blob("{}", "").replace(0, 2, "\xe8\x03"),
           "the header length field says 1000 bytes but only 2 bytes follow it");
  }
  SUBCASE("bad JSON") {
    expect(Blob("{not json", ""),
           "has a bad safetensors header: expected 9 bytes of UTF-8 JSON, found unparsable text");
  }
  SUBCASE("not an object") { expect(Blob("[1]", ""), "expected a JSON object, found [1]"); }
  SUBCASE("repeated name") {
    expect(
        Blob(
            R"({"w":{"dtype":"U8","shape":[],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[],"data_offsets":[0,1]}})",
            "\1"),
        "the name 'w' appears twice");
  }
  SUBCASE("unknown dtype code") {
    expect(Blob(R"({"w":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", "\1\1"),
           "tensor 'w' has a bad header entry: dtype \"F8\" is not supported by kiln (expected one of F32, "
           "F64, F16, "
           "BF16, I32, I64, U8, BOOL)");
  }
  SUBCASE("wrong keys, shapes and offsets") {
    expect(Blob(R"({"w":{"dtype":"F32","shape":[2]}})", f32),
           "tensor 'w' has a bad header entry: expected the keys dtype, shape, data_offsets");
    expect(Blob(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32),
           "expected shape to be a list of at most 8 non-negative integers, found [-2]");
    expect(Blob(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f32),
           "expected data_offsets [begin, end] with 0 <= begin <= end, found [8,0]");
  }
  SUBCASE("offsets not matching shape times dtype size") {
    expect(Blob(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", f32),
           "tensor 'w' has a bad header entry: a F32 tensor of shape (2,) needs 8 bytes but data_offsets "
           "[0,4] span 4");
  }
  SUBCASE("offsets out of range") {
    expect(Blob(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "\1\1\1\1"),
           "is truncated: tensor 'w' needs bytes [0,8] of the data section but only 4 bytes are there");
  }
  SUBCASE("overlapping and gaps") {
    expect(
        Blob(
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            std::string(12, '\1')),
        "tensor 'b' starts at byte 4 of the data section, expected 8 (where 'a' ends): it overlaps");
    expect(
        Blob(
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            std::string(12, '\1')),
        "tensor 'b' starts at byte 8 of the data section, expected 4 (where 'a' ends): it leaves a gap");
  }
  SUBCASE("trailing garbage") {
    expect(
        Blob(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32 + "x"),
        "the header describes 8 bytes of data but 9 follow it; the file is damaged or has trailing garbage");
  }
  SUBCASE("booleans other than 0 and 1") {
    expect(Blob(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", std::string("\1\2\0", 3)),
           "bool tensor 'm' holds the byte 2 at element 1");
  }
  SUBCASE("bad metadata") {
    expect(Blob(R"({"__metadata__":{"format":1}})", ""),
           "has a bad __metadata__ entry: expected an object of strings");
  }
  SUBCASE("missing file") {
    CHECK_THROWS_WITH_AS(LoadParams(dir / "nope.params"), doctest::Contains("cannot open"), FormatError);
  }
}

TEST_CASE("format: params checked against the manifest, all differences at once") {
  Mlp mlp;
  std::vector<NamedHostTensor> params = {{"1.weight", Patterned(DType::kFloat32, {4, 16})},
                                         {"0.weight", Patterned(DType::kFloat32, {8, 16})},
                                         {"1.bias", Patterned(DType::kFloat32, {4})},
                                         {"0.bias", Patterned(DType::kFloat32, {16})}};
  std::vector<const HostTensor*> ordered = CheckParams(mlp.g, mlp.m, params, "mlp-0000.params");
  REQUIRE(ordered.size() == 4);
  CHECK(ordered[0] == &params[1].second); // manifest order
  CHECK(ordered[3] == &params[2].second);

  params[0].second = Patterned(DType::kFloat16, {4, 16});
  params[3].second = Patterned(DType::kFloat32, {17});
  params[2].first = "2.bias";
  CHECK_THROWS_WITH_AS(CheckParams(mlp.g, mlp.m, params, "mlp-0000.params"),
                       "mlp-0000.params: 4 difference(s) between the parameters and the graph:\n"
                       "  '0.bias' is float32(17,) but the graph expects float32(16,)\n"
                       "  '1.weight' is float16(4, 16) but the graph expects float32(4, 16)\n"
                       "  missing '1.bias' (float32(4,))\n"
                       "  extra '2.bias' (float32(4,)), not a parameter of the graph\n"
                       "load the params file exported together with this graph, or export both again",
                       FormatError);
}

} // namespace
} // namespace kiln::ir
