// The params file (`NAME-0000.params`) in the safetensors layout, kiln's one implementation of it
// (the Python package writes and reads through it, python/src/params.cc): an 8-byte little-endian header length N,
// N bytes of JSON {"__metadata__": {"format": "kiln"}, name: {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]}, ...} padded with spaces to a multiple of 8, then the raw
// little-endian data, offsets relative to the end of the header. Loading checks, in this order:
// the file holds a header length and that many bytes (at most 100 MiB, the reference bound), the
// header is a JSON object without repeated names, each entry has exactly dtype/shape/data_offsets
// with a known dtype tag, sizes >= 0 and offsets spanning shape * dtype size bytes inside the
// data, the entries tile the data with no gap, overlap or trailing bytes, and bool bytes are 0/1.
// Not here: memory mapping, lazy loading, dtypes kiln has no type for (F8, I16, ...).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/ir/serialize.h"
#include "kiln/runtime/error.h"

namespace kiln::ir {

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json; // keeps keys in the order written, as Python does

constexpr uint64_t kHeaderLimit = 100ull * 1024 * 1024;
constexpr const char* kResave = "re-save it with save_parameters, or check the path";

struct Tag {
  DType dtype;
  const char* tag;
};
constexpr Tag kTags[] = {{DType::kFloat32, "F32"},   {DType::kFloat64, "F64"}, {DType::kFloat16, "F16"},
                         {DType::kBFloat16, "BF16"}, {DType::kInt32, "I32"},   {DType::kInt64, "I64"},
                         {DType::kUInt8, "U8"},      {DType::kBool, "BOOL"}};

const char* TagOf(DType t) {
  for (const Tag& e : kTags)
    if (e.dtype == t) return e.tag;
  KILN_CHECK(false) << "dtype " << DTypeName(t) << " has no safetensors tag";
  return "";
}

std::string TagList() {
  std::string s;
  for (const Tag& e : kTags) s += std::string(s.empty() ? "" : ", ") + e.tag;
  return s;
}

std::string Short(const Json& j) {
  std::string s = j.dump(-1, ' ', true, Json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

std::string Type(DType t, const Shape& s) { return std::string(DTypeName(t)) + s.str(); }

// Bytes of `shape` x `dtype` as kiln counts them (Shape::NumBytes), or nullopt when kiln cannot
// hold the shape: its sizes other than zero multiply past 2^63 (so a zero size does not excuse
// them: fuzz_npy found such a shape accepted and then refused by every use).
std::optional<uint64_t> ByteSize(const Shape& shape, DType dtype) {
  try {
    return static_cast<uint64_t>(shape.NumBytes(DTypeSize(dtype)));
  } catch (const ShapeError&) {
    return std::nullopt;
  }
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

class ParamsReader {
public:
  explicit ParamsReader(const std::string& path) : path_(path) {}

  [[noreturn]] void Fail(const std::string& what) const {
    KILN_THROW(FormatError) << "'" << path_ << "': " << what;
  }

  Entry Read(const std::string& name, const Json& e, uint64_t data_len) const {
    std::string bad = "tensor '" + name + "' has a bad header entry: ";
    if (!e.is_object() || e.size() != 3 || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets"))
      Fail(bad + "expected the keys dtype, shape, data_offsets, found " + Short(e) + "; " + kResave);
    Entry out{name, DType::kFloat32, {}, 0, 0};
    const Tag* tag = nullptr;
    for (const Tag& t : kTags)
      if (e["dtype"] == t.tag) tag = &t;
    if (!tag)
      Fail(bad + "dtype " + Short(e["dtype"]) + " is not supported by kiln (expected one of " + TagList() +
           "); convert the tensor before loading");
    out.dtype = tag->dtype;
    const Json& shape = e["shape"];
    bool ok = shape.is_array() && shape.size() <= static_cast<size_t>(kMaxRank);
    for (size_t i = 0; ok && i < shape.size(); ++i) {
      ok = shape[i].is_number_unsigned() && shape[i].get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
      if (ok) out.shape.push_back(shape[i].get<int64_t>());
    }
    if (!ok)
      Fail(bad + "expected shape to be a list of at most " + std::to_string(kMaxRank) +
           " non-negative integers, found " + Short(shape));
    const Json& offsets = e["data_offsets"];
    ok = offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
         offsets[1].is_number_unsigned() && offsets[0].get<uint64_t>() <= offsets[1].get<uint64_t>();
    if (!ok) Fail(bad + "expected data_offsets [begin, end] with 0 <= begin <= end, found " + Short(offsets));
    out.begin = offsets[0].get<uint64_t>();
    out.end = offsets[1].get<uint64_t>();
    std::optional<uint64_t> want = ByteSize(out.shape, out.dtype);
    if (!want || out.end - out.begin != *want)
      Fail(bad + "a " + tag->tag + " tensor of shape " + out.shape.str() + " needs " +
           (want ? std::to_string(*want) : std::string("more than 2^63")) + " bytes but data_offsets " +
           Short(offsets) + " span " + std::to_string(out.end - out.begin) + "; the file is damaged");
    if (out.end > data_len)
      Fail("is truncated: tensor '" + name + "' needs bytes " + Short(offsets) +
           " of the data section but only " + std::to_string(data_len) +
           " bytes are there; the write or copy was cut short, save the parameters again");
    return out;
  }

private:
  const std::string& path_;
};

} // namespace

void SaveParams(const std::string& path, const std::vector<NamedHostTensor>& params) {
  SaveParams(path, params, {{"format", "kiln"}});
}

void SaveParams(const std::string& path, const std::vector<NamedHostTensor>& params,
                const std::vector<std::pair<std::string, std::string>>& metadata) {
  WriteFileAtomic(path, ParamsBytes(params, metadata, path));
}

std::string ParamsBytes(const std::vector<NamedHostTensor>& params,
                        const std::vector<std::pair<std::string, std::string>>& metadata, const std::string& path) {
  // The header is assembled entry by entry (an ordered JSON object would search its keys on every
  // insertion); each piece is dumped like json.dumps(separators=(",", ":")) with ASCII escapes.
  auto dump = [&](const OrderedJson& j) -> std::string {
    try {
      return j.dump(-1, ' ', /*ensure_ascii=*/true);
    } catch (const nlohmann::json::type_error&) {
      KILN_THROW(ValueError) << "SaveParams('" << path << "'): a tensor name is not valid UTF-8";
    }
  };
  std::string text = "{";
  if (!metadata.empty()) {
    OrderedJson m = OrderedJson::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    text += R"("__metadata__":)" + dump(m);
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : params) {
    if (name == "__metadata__" || !names.insert(name).second)
      KILN_THROW(ValueError) << "SaveParams('" << path << "'): the name '" << name
                             << "' is used twice (or is the reserved __metadata__); names must be unique";
    if (text.size() > 1) text += ',';
    std::optional<uint64_t> want = ByteSize(t.shape, t.dtype);
    if (!want || t.bytes.size() != *want)
      KILN_THROW(ValueError) << "SaveParams('" << path << "'): tensor '" << name << "' of type "
                             << Type(t.dtype, t.shape) << " needs "
                             << (want ? std::to_string(*want) : "too many") << " bytes but holds "
                             << t.bytes.size();
    text += dump(name);
    text += ':';
    text += dump(OrderedJson{
        {"dtype", TagOf(t.dtype)}, {"shape", t.shape.vec()}, {"data_offsets", {offset, offset + *want}}});
    offset += *want;
  }
  text += "}";
  text.append((8 - text.size() % 8) % 8, ' '); // the data starts 8-byte aligned
  std::string blob(8, '\0');
  for (int i = 0; i < 8; ++i)
    blob[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  blob.reserve(8 + text.size() + offset);
  blob += text;
  for (const auto& [name, t] : params)
    blob.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  return blob;
}

std::vector<NamedHostTensor> LoadParams(const std::string& path,
                                        std::map<std::string, std::string>* metadata) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    KILN_THROW(FormatError) << "cannot open '" << path << "': " << std::strerror(errno) << "; check the path";
  std::ostringstream os;
  os << f.rdbuf();
  return ParseParams(os.str(), path, metadata);
}

std::vector<NamedHostTensor> ParseParams(std::string_view blob, const std::string& source,
                                         std::map<std::string, std::string>* metadata) {
  ParamsReader r(source);

  if (blob.size() < 8)
    r.Fail("is not a safetensors file: expected at least an 8-byte header length, found a file of " +
           std::to_string(blob.size()) + " bytes; " + kResave);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(blob[i]);
  if (n > std::min<uint64_t>(blob.size() - 8, kHeaderLimit))
    r.Fail("is not a safetensors file (or is truncated): the header length field says " + std::to_string(n) +
           " bytes but only " + std::to_string(blob.size() - 8) + " bytes follow it" +
           (n > kHeaderLimit ? " (and the limit is 100 MiB)" : "") + "; " + kResave);

  // The callback records the names in file order (the object itself is a sorted map, fast to
  // build) and rejects a repeated name instead of keeping the last one.
  std::vector<std::string> order;
  std::set<std::string> seen;
  Json::parser_callback_t cb = [&](int depth, Json::parse_event_t ev, Json& parsed) {
    if ((ev == Json::parse_event_t::object_start || ev == Json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      r.Fail("has a bad safetensors header: arrays and objects nest deeper than the limit of " +
             std::to_string(kMaxJsonDepth) + " levels (a header needs 3); the file is damaged; " + kResave);
    if (ev != Json::parse_event_t::key || depth != 1) return true;
    std::string name = parsed.get<std::string>();
    if (!seen.insert(name).second)
      r.Fail("has a bad safetensors header: the name '" + name + "' appears twice; the file is damaged; " +
             kResave);
    order.push_back(std::move(name));
    return true;
  };
  Json header;
  try {
    header = Json::parse(blob.begin() + 8, blob.begin() + 8 + static_cast<std::ptrdiff_t>(n), cb);
  } catch (const nlohmann::json::parse_error& e) {
    r.Fail("has a bad safetensors header: expected " + std::to_string(n) +
           " bytes of UTF-8 JSON, found unparsable text (" + e.what() +
           "); the file is damaged or not a safetensors file; " + kResave);
  } catch (const nlohmann::json::out_of_range& e) { // 406: a number past a double (found by fuzz_params)
    std::string detail = e.what();
    if (auto p = detail.find("number overflow"); p != std::string::npos) detail = detail.substr(p);
    r.Fail("has a bad safetensors header: expected numbers that fit a double, found " + detail +
           "; the file is damaged; " + kResave);
  }
  if (!header.is_object())
    r.Fail("has a bad safetensors header: expected a JSON object, found " + Short(header) + " (" +
           (header.is_array() ? "a list" : header.is_string() ? "a string" : "a " + std::string(header.type_name())) +
           "); " + kResave);

  const uint64_t start = 8 + n, data_len = blob.size() - start;
  std::vector<Entry> entries;
  for (const std::string& name : order) {
    const Json& e = header.at(name);
    if (name != "__metadata__") {
      entries.push_back(r.Read(name, e, data_len));
      continue;
    }
    bool ok = e.is_null() || e.is_object();
    if (e.is_object())
      for (const auto& [k, v] : e.items()) ok &= v.is_string();
    if (!ok) r.Fail("has a bad __metadata__ entry: expected an object of strings, found " + Short(e));
    if (metadata && e.is_object())
      for (const auto& [k, v] : e.items()) (*metadata)[k] = v.get<std::string>();
  }

  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : by_offset) {
    if (e->begin != covered)
      r.Fail("tensor '" + e->name + "' starts at byte " + std::to_string(e->begin) +
             " of the data section, expected " + std::to_string(covered) +
             (prev ? " (where '" + prev->name + "' ends)" : std::string()) + ": it " +
             (e->begin < covered ? "overlaps" : "leaves a gap") +
             "; data_offsets must tile the data section; the file is damaged");
    covered = e->end;
    prev = e;
  }
  if (covered != data_len)
    r.Fail("the header describes " + std::to_string(covered) + " bytes of data but " +
           std::to_string(data_len) + " follow it; the file is damaged or has trailing garbage");

  std::vector<NamedHostTensor> out;
  out.reserve(entries.size());
  for (const Entry& e : entries) {
    const auto* p = reinterpret_cast<const uint8_t*>(blob.data() + start + e.begin);
    HostTensor t{e.dtype, e.shape, std::vector<uint8_t>(p, p + (e.end - e.begin))};
    if (e.dtype == DType::kBool)
      for (size_t i = 0; i < t.bytes.size(); ++i)
        if (t.bytes[i] > 1)
          r.Fail("bool tensor '" + e.name + "' holds the byte " + std::to_string(t.bytes[i]) +
                 " at element " + std::to_string(i) + "; booleans must be 0 or 1; the file is damaged");
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

std::vector<const HostTensor*> CheckParams(const Graph& g, const GraphManifest& m,
                                           const std::vector<NamedHostTensor>& params,
                                           std::string_view source) {
  KILN_CHECK(g.inputs().size() == m.inputs.size() + m.params.size())
      << "the manifest does not describe the graph's inputs";
  std::map<std::string_view, const HostTensor*> by_name;
  for (const auto& [name, t] : params) by_name.emplace(name, &t);
  std::vector<std::string> problems;
  std::vector<const HostTensor*> out;
  std::set<std::string_view> expected;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const std::string& name = m.params[i];
    expected.insert(name);
    const TensorType& want = g.inputs()[m.inputs.size() + i]->type();
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      problems.push_back("missing '" + name + "' (" + Type(want.dtype, want.shape) + ")");
      continue;
    }
    const HostTensor& t = *it->second;
    if (t.dtype != want.dtype || !(t.shape == want.shape))
      problems.push_back("'" + name + "' is " + Type(t.dtype, t.shape) + " but the graph expects " +
                         Type(want.dtype, want.shape));
    out.push_back(&t);
  }
  for (const auto& [name, t] : params)
    if (!expected.count(name))
      problems.push_back("extra '" + name + "' (" + Type(t.dtype, t.shape) +
                         "), not a parameter of the graph");
  if (!problems.empty()) {
    std::string list;
    for (const std::string& p : problems) list += "\n  " + p;
    KILN_THROW(FormatError)
        << source << ": " << problems.size() << " difference(s) between the parameters and the graph:" << list
        << "\nload the params file exported together with this graph, or export both again";
  }
  return out;
}

} // namespace kiln::ir
