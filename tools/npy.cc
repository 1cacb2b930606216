// .npy reading and writing; see npy.h. Format reference: numpy/lib/format.py. The header is a
// Python dict literal, parsed here by a strict little scanner that accepts exactly the three keys
// NumPy writes.
#include "npy.h"

#include <cctype>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "kiln/runtime/error.h"

namespace kiln::tools {
namespace {

struct Descr {
  const char* tag;
  DType dtype;
};
constexpr Descr kDescrs[] = {{"<f4", DType::kFloat32}, {"<f8", DType::kFloat64}, {"<f2", DType::kFloat16},
                             {"<i4", DType::kInt32},   {"<i8", DType::kInt64},   {"|u1", DType::kUInt8},
                             {"|b1", DType::kBool}};
constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

std::string Supported() {
  std::string s;
  for (const Descr& d : kDescrs) s += std::string(s.empty() ? "" : ", ") + "'" + d.tag + "' (" + DTypeName(d.dtype) + ")";
  return s;
}

class HeaderScanner {
 public:
  HeaderScanner(const std::string& text, const std::string& source) : t_(text), source_(source) {}

  [[noreturn]] void Fail(const std::string& what) const {
    KILN_THROW(FormatError) << "'" << source_ << "': bad .npy header " << t_ << ": " << what
                            << "; write the file with numpy.save";
  }
  void Space() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  bool Eat(char c) {
    Space();
    if (i_ < t_.size() && t_[i_] == c) return ++i_, true;
    return false;
  }
  void Expect(char c) {
    if (!Eat(c)) Fail(std::string("expected '") + c + "' at character " + std::to_string(i_));
  }
  std::string String() {
    Space();
    if (i_ >= t_.size() || (t_[i_] != '\'' && t_[i_] != '"')) Fail("expected a quoted string at character " + std::to_string(i_));
    char q = t_[i_++];
    size_t end = t_.find(q, i_);
    if (end == std::string::npos) Fail("unterminated string");
    std::string s = t_.substr(i_, end - i_);
    i_ = end + 1;
    return s;
  }
  bool Bool() {
    Space();
    for (auto [word, v] : {std::pair{"True", true}, std::pair{"False", false}})
      if (t_.compare(i_, std::strlen(word), word) == 0) return i_ += std::strlen(word), v;
    Fail("expected True or False at character " + std::to_string(i_));
  }
  std::vector<int64_t> Tuple() {
    Expect('(');
    std::vector<int64_t> dims;
    while (!Eat(')')) {
      Space();
      size_t start = i_;
      while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_]))) ++i_;
      if (start == i_ || i_ - start > 18) Fail("expected a non-negative dimension at character " + std::to_string(start));
      dims.push_back(std::stoll(t_.substr(start, i_ - start)));
      if (!Eat(',')) {
        Expect(')');
        break;
      }
    }
    return dims;
  }
  bool AtEnd() {
    Space();
    return i_ == t_.size();
  }

 private:
  const std::string& t_;
  const std::string& source_;
  size_t i_ = 0;
};

uint64_t ReadLE(const std::string& b, size_t at, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(b[at + k]);
  return v;
}

}  // namespace

ir::HostTensor ParseNpy(const std::string& b, const std::string& source) {
  auto fail = [&](const std::string& what) -> void {
    KILN_THROW(FormatError) << "'" << source << "': " << what;
  };
  if (b.size() < kMagicLen + 2 || b.compare(0, kMagicLen, kMagic, kMagicLen) != 0)
    fail("is not a .npy file (it does not start with \\x93NUMPY); write it with numpy.save");
  int major = static_cast<uint8_t>(b[6]);
  if (major < 1 || major > 3)
    fail(".npy version " + std::to_string(major) + "." + std::to_string(static_cast<uint8_t>(b[7])) +
         " is not supported (expected 1.0, 2.0 or 3.0)");
  const size_t len_bytes = major == 1 ? 2 : 4, start = kMagicLen + 2 + len_bytes;
  if (b.size() < start) fail("is truncated inside its header");
  const uint64_t header_len = ReadLE(b, kMagicLen + 2, static_cast<int>(len_bytes));
  if (header_len > b.size() - start)
    fail("is truncated: the header length field says " + std::to_string(header_len) + " bytes but only " +
         std::to_string(b.size() - start) + " follow");
  std::string header = b.substr(start, header_len);
  while (!header.empty() && (header.back() == '\n' || header.back() == ' ')) header.pop_back();

  HeaderScanner s(header, source);
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<std::vector<int64_t>> dims;
  s.Expect('{');
  while (!s.Eat('}')) {
    std::string key = s.String();
    s.Expect(':');
    if (key == "descr" && !descr) descr = s.String();
    else if (key == "fortran_order" && !fortran) fortran = s.Bool();
    else if (key == "shape" && !dims) dims = s.Tuple();
    else s.Fail("unexpected or repeated key '" + key + "' (expected descr, fortran_order and shape)");
    if (!s.Eat(',')) {
      s.Expect('}');
      break;
    }
  }
  if (!s.AtEnd()) s.Fail("text after the closing '}'");
  if (!descr || !fortran || !dims) s.Fail("expected the keys descr, fortran_order and shape");
  if (*fortran)
    fail("holds a Fortran-order (column-major) array; kiln reads C order only: save "
         "numpy.ascontiguousarray(a) instead");
  const Descr* d = nullptr;
  for (const Descr& c : kDescrs)
    if (*descr == c.tag || (descr->size() == 3 && (*descr)[0] == '<' && std::string("|") + descr->substr(1) == c.tag))
      d = &c;
  if (!d) {
    bool big = !descr->empty() && descr->front() == '>' && descr->size() > 2 && (*descr)[2] != '1';
    fail("has dtype '" + *descr + "'" + (big ? ", which is big-endian," : "") + " that kiln does not read (expected " +
         Supported() + "); convert it with a.astype('<f4') or another of these first");
  }
  if (dims->size() > static_cast<size_t>(kMaxRank))
    fail("has " + std::to_string(dims->size()) + " dimensions; kiln supports at most " + std::to_string(kMaxRank));
  ir::HostTensor out{d->dtype, Shape(*dims), {}};
  // As kiln counts bytes (Shape::NumBytes): sizes other than zero that multiply past 2^63 are
  // refused even beside a zero size, which every later use of the shape would refuse.
  uint64_t need = 0;
  try {
    need = static_cast<uint64_t>(out.shape.NumBytes(DTypeSize(d->dtype)));
  } catch (const ShapeError&) {
    fail("has an absurd shape " + out.shape.str() + ": its sizes multiply past 2^63 (zeros aside); the "
         "header is damaged");
  }
  const uint64_t have = b.size() - start - header_len;
  if (have < need)
    fail("is truncated: a " + std::string(DTypeName(d->dtype)) + out.shape.str() + " array needs " +
         std::to_string(need) + " bytes of data but only " + std::to_string(have) + " are there; save it again");
  if (have > need)
    fail("has " + std::to_string(have - need) + " bytes after the data of its " + DTypeName(d->dtype) +
         out.shape.str() + " array; the file is damaged or not a single .npy array");
  const auto* p = reinterpret_cast<const uint8_t*>(b.data() + start + header_len);
  out.bytes.assign(p, p + need);
  if (d->dtype == DType::kBool)
    for (uint8_t& v : out.bytes) v = v != 0;
  return out;
}

ir::HostTensor ReadNpy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) KILN_THROW(FormatError) << "cannot open '" << path << "': " << std::strerror(errno) << "; check the path";
  std::ostringstream os;
  os << f.rdbuf();
  return ParseNpy(os.str(), path);
}

std::string NpyBytes(const ir::HostTensor& t) {
  const Descr* d = nullptr;
  for (const Descr& c : kDescrs)
    if (c.dtype == t.dtype) d = &c;
  if (!d)
    KILN_THROW(ValueError) << "NumPy has no dtype for " << DTypeName(t.dtype) << "; cast the tensor to float32 first";
  std::string shape = "(";
  for (int i = 0; i < t.shape.rank(); ++i) shape += std::to_string(t.shape[i]) + (t.shape.rank() == 1 ? "," : i + 1 < t.shape.rank() ? ", " : "");
  shape += ")";
  std::string header = "{'descr': '" + std::string(d->tag) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad with spaces so that the data starts at a multiple of 64 bytes, ending in '\n'.
  size_t total = kMagicLen + 2 + 2 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic, kMagicLen);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  return out;
}

void WriteNpy(const std::string& path, const ir::HostTensor& t) { ir::WriteFileAtomic(path, NpyBytes(t)); }

}  // namespace kiln::tools
