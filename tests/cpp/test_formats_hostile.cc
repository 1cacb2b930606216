// Hostile inputs of the graph JSON and params readers that test_formats.cc does not cover (issue
// 17): nesting deeper than kMaxJsonDepth (which overflowed the stack of recursive code walking the
// tree), byte sizes that overflow 64 bits, non-finite or reversed attribute values an op refuses,
// and absurd dimensions. Each asserts FormatError and its message. Also the IDX reader's findings
// (tests/fuzz: their inputs are replayed from tests/fuzz/corpus by test_fuzz_corpus.cc).
#include <unistd.h>

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "kiln/frontend/idx.h"
#include "kiln/ir/serialize.h"
#include "tools/npy.h"

namespace kiln::ir {
namespace {

namespace fs = std::filesystem;
using Ints = std::vector<int64_t>;

std::string GraphErrorOf(const std::string& text) {
  try {
    GraphFromJson(text);
  } catch (const FormatError& e) {
    return e.what();
  }
  FAIL("no FormatError for a document of " << text.size() << " bytes");
  return "";
}

// A graph of one random_uniform draw, as JSON.
std::string RandomGraphJson() {
  Graph g;
  Builder b(g);
  g.AddInput("data", {{2}, DType::kFloat32});
  Value* u = b.Op("random_uniform", {}, {{"shape", Ints{2}}, {"low", 0.0}, {"high", 1.0}});
  g.SetOutputs({b.Add(u, g.inputs()[0])});
  GraphManifest m;
  m.inputs = {"data"};
  m.output_structure = OutputStructure::Leaf(0);
  return GraphToJson(g, m);
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "not in the document: " << from);
  return text.replace(at, from.size(), to);
}

// A params file from a header text and data bytes.
std::string ParamsBlob(const std::string& header, const std::string& data) {
  std::string blob(8, '\0');
  for (int i = 0; i < 8; ++i) blob[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return blob + header + data;
}

std::string ParamsErrorOf(const std::string& bytes) {
  fs::path path = fs::temp_directory_path() / ("kiln_hostile_" + std::to_string(::getpid()) + ".params");
  {
    std::ofstream f(path, std::ios::binary);
    f << bytes;
  }
  std::string msg = "no FormatError";
  try {
    LoadParams(path.string());
  } catch (const FormatError& e) {
    msg = e.what();
  }
  fs::remove(path);
  return msg;
}

TEST_CASE("hostile graph json: arrays nested far past the depth limit are a FormatError, not a crash") {
  for (size_t depth : {size_t{129}, size_t{1000}, size_t{1} << 20}) {
    CAPTURE(depth);
    std::string doc = R"({"format": "kiln-graph", "nodes": )" + std::string(depth, '[') + std::string(depth, ']') + "}";
    std::string msg = GraphErrorOf(doc);
    CHECK_MESSAGE(msg.find("the document: arrays and objects nest deeper than the limit of 128 levels") !=
                      std::string::npos,
                  msg);
    CHECK_MESSAGE(msg.find("export the model again") != std::string::npos, msg);
  }
  // Objects count as well as arrays.
  std::string objects;
  for (int i = 0; i < 5000; ++i) objects += R"({"a":)";
  objects += "1" + std::string(5000, '}');
  CHECK(GraphErrorOf(objects).find("nest deeper than the limit of 128 levels") != std::string::npos);
}

TEST_CASE("hostile graph json: nesting within the depth limit reaches the normal checks") {
  // 100 levels inside the document: the parser accepts it and the loader names the real problem.
  std::string doc = R"({"format": "kiln-graph", "nodes": )" + std::string(100, '[') + std::string(100, ']') + "}";
  std::string msg = GraphErrorOf(doc);
  CHECK_MESSAGE(msg.find("nest deeper") == std::string::npos, msg);
  CHECK_MESSAGE(msg.find("kiln-graph.json") == std::string::npos, msg);
}

TEST_CASE("hostile graph json: attribute values the op refuses name the node") {
  const std::string ok = RandomGraphJson();
  CHECK_NOTHROW(GraphFromJson(ok));
  std::string msg = GraphErrorOf(Replace(ok, "\"low\":0.0", "\"low\":\"nan\""));
  CHECK_MESSAGE(msg.find("(random_uniform): the op rejects its recorded inputs or attributes") != std::string::npos,
                msg);
  CHECK_MESSAGE(msg.find("expected finite bounds with low <= high, found low=nan") != std::string::npos, msg);
  msg = GraphErrorOf(Replace(ok, "\"low\":0.0", "\"low\":2.0"));
  CHECK_MESSAGE(msg.find("found low=2, high=1") != std::string::npos, msg);
  msg = GraphErrorOf(Replace(ok, "\"high\":1.0", "\"high\":\"inf\""));
  CHECK_MESSAGE(msg.find("expected finite bounds") != std::string::npos, msg);
}

TEST_CASE("hostile graph json: absurd dimensions of an input are refused") {
  const std::string ok = RandomGraphJson();
  std::string msg = GraphErrorOf(Replace(ok, "\"shape\":[2]}", "\"shape\":[-9223372036854775807]}"));
  CHECK_MESSAGE(msg.find("inputs[0].shape[0]: expected a size >= 0, found -9223372036854775807") != std::string::npos,
                msg);
  msg = GraphErrorOf(Replace(ok, "\"shape\":[2]}", "\"shape\":[18446744073709551615]}"));
  CHECK_MESSAGE(msg.find("inputs[0].shape[0]: expected an integer, found an integer 18446744073709551615") !=
                    std::string::npos,
                msg);
}

TEST_CASE("hostile graph json and params: a number past a double is a FormatError, not a JSON library error") {
  // Found by tests/fuzz (fuzz_symbol_json, fuzz_params): nlohmann's out_of_range (406) escaped both readers.
  std::string msg = GraphErrorOf(Replace(RandomGraphJson(), "\"low\":0.0", "\"low\":1e999"));
  CHECK_MESSAGE(msg.find("expected numbers that fit a double, found number overflow parsing '1e999'") !=
                    std::string::npos,
                msg);
  msg = ParamsErrorOf(ParamsBlob(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1e400]}})", "\1"));
  CHECK_MESSAGE(msg.find("has a bad safetensors header: expected numbers that fit a double, found number overflow") !=
                    std::string::npos,
                msg);
}

TEST_CASE("hostile params: a header nested past the depth limit is a FormatError, not a crash") {
  const size_t depth = size_t{1} << 20;
  std::string header = R"({"w":{"dtype":"F32","shape":)" + std::string(depth, '[') + std::string(depth, ']') +
                       R"(,"data_offsets":[0,0]}})";
  std::string msg = ParamsErrorOf(ParamsBlob(header, ""));
  CHECK_MESSAGE(msg.find("has a bad safetensors header: arrays and objects nest deeper than the limit of 128 "
                         "levels (a header needs 3)") != std::string::npos,
                msg);
  msg = ParamsErrorOf(ParamsBlob("[" + std::string(200, '[') + std::string(200, ']') + "]", ""));
  CHECK_MESSAGE(msg.find("nest deeper than the limit of 128 levels") != std::string::npos, msg);
}

TEST_CASE("hostile params: a shape whose byte size overflows 64 bits is refused") {
  // 2^61 * 2 float64 elements: the element count fits in int64, the byte count does not.
  std::string msg = ParamsErrorOf(
      ParamsBlob(R"({"w":{"dtype":"F64","shape":[2305843009213693952,2],"data_offsets":[0,8]}})", std::string(8, '\0')));
  CHECK_MESSAGE(msg.find("tensor 'w' has a bad header entry: a F64 tensor of shape (2305843009213693952, 2) "
                         "needs more than 2^63 bytes") != std::string::npos,
                msg);
  msg = ParamsErrorOf(ParamsBlob(R"({"w":{"dtype":"F32","shape":[1e30],"data_offsets":[0,4]}})", std::string(4, '\0')));
  CHECK_MESSAGE(msg.find("expected shape to be a list of at most 8 non-negative integers, found [1e+30]") !=
                    std::string::npos,
                msg);
}

TEST_CASE("hostile params: offsets past the end and a header cut short are refused") {
  std::string msg = ParamsErrorOf(ParamsBlob(
      R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[18446744073709551614,18446744073709551615]}})", "\1\1"));
  CHECK_MESSAGE(msg.find("a U8 tensor of shape (2,) needs 2 bytes but data_offsets") != std::string::npos, msg);
  msg = ParamsErrorOf(ParamsBlob(
      R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}})", "\1"));
  CHECK_MESSAGE(msg.find("is truncated: tensor 'w' needs bytes") != std::string::npos, msg);
  // The header of a real file cut in the middle of its JSON.
  std::string full = ParamsBlob(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "\1");
  msg = ParamsErrorOf(full.substr(0, 30));
  CHECK_MESSAGE(msg.find("the header length field says") != std::string::npos, msg);
}

}  // namespace
}  // namespace kiln::ir

namespace kiln {
namespace {

std::string IdxErrorOf(const std::string& bytes) {
  try {
    ParseIdxHeader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "t.idx");
  } catch (const FormatError& e) {
    return e.what();
  }
  FAIL("no FormatError for an IDX blob of " << bytes.size() << " bytes");
  return "";
}

std::string BigEndian(std::initializer_list<uint32_t> words) {
  std::string s;
  for (uint32_t w : words)
    for (int i = 3; i >= 0; --i) s += static_cast<char>((w >> (8 * i)) & 0xff);
  return s;
}

TEST_CASE("hostile idx: dimensions whose element count passes 2^64 are refused, not wrapped to 0") {
  // 2^20 * 2^20 * 2^24 = 2^64 elements: the count wrapped to 0 and an empty body was accepted.
  std::string msg = IdxErrorOf(BigEndian({0x803, 1u << 20, 1u << 20, 1u << 24}));
  CHECK_MESSAGE(msg.find("IDX file 't.idx': the dimensions promise more than 2^40 elements") != std::string::npos,
                msg);
}

TEST_CASE("hostile idx: a zero dimension is an empty array, copied without touching memory") {
  // Found by tests/fuzz/fuzz_idx: the copy passed a null destination to memcpy (UBSan).
  std::string blob = BigEndian({0x803, 0x860100, 0, 0x123});
  IdxHeader h = ParseIdxHeader(reinterpret_cast<const uint8_t*>(blob.data()), blob.size(), "t.idx");
  CHECK(h.dims == std::vector<int64_t>{0x860100, 0, 0x123});
  CHECK(h.data_offset == blob.size());
  CopyIdxData(reinterpret_cast<const uint8_t*>(blob.data()), blob.size(), h, nullptr);
  CHECK(IdxErrorOf(blob + "x").find("trailing bytes follow the data") != std::string::npos);
}

TEST_CASE("hostile npy, params and idx: a zero size does not excuse sizes that multiply past 2^63") {
  // Found by tests/fuzz/fuzz_npy: (0, 3232, 32, 92232, 3232, 3232, 32, 3) was read as an empty array
  // whose shape every use then refused (Shape::numel); the params and IDX readers had the same gap.
  std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 3232, 32, 92232, 3232, 3232, 32, 3), }";
  header.append(118 - 10 - header.size(), ' ').append("\n");
  std::string npy = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
  try {
    tools::ParseNpy(npy, "z.npy");
    FAIL("no FormatError");
  } catch (const FormatError& e) {
    CHECK_MESSAGE(std::string(e.what()).find("'z.npy': has an absurd shape (0, 3232, 32, 92232, 3232, 3232, 32, 3): "
                                             "its sizes multiply past 2^63") != std::string::npos,
                  e.what());
  }
  std::string params = R"({"w":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})";
  std::string blob(8, '\0');
  blob[0] = static_cast<char>(params.size());
  try {
    ir::ParseParams(blob + params, "z.params");
    FAIL("no FormatError");
  } catch (const FormatError& e) {
    CHECK_MESSAGE(std::string(e.what()).find("a F32 tensor of shape (0, 4611686018427387904, 4) needs more than "
                                             "2^63 bytes") != std::string::npos,
                  e.what());
  }
  std::string msg = IdxErrorOf(BigEndian({0x804, 0, 0x7fffffff, 0x7fffffff, 0x7fffffff}));
  CHECK_MESSAGE(msg.find("the dimensions promise more than 2^40 elements") != std::string::npos, msg);
  // Zeros beside sane sizes stay empty arrays.
  CHECK(ir::ParseParams(blob.replace(0, 1, 1, static_cast<char>(56)) +
                            R"({"w":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}})",
                        "e.params")[0].second.shape == Shape{0, 3});
}

}  // namespace
}  // namespace kiln
