// Printer and parser of the graph text form (grammar in include/kiln/ir/text.h). The parser is a
// lazy one-token-lookahead lexer plus recursive descent over lines; it does no recovery: the first
// error throws. It does not know the JSON format (ir/json.cc) nor parameters.
#include "kiln/ir/text.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "kiln/ir/verify.h"
#include "kiln/runtime/error.h"

namespace kiln::ir {

// ---------------------------------------------------------------------------------------------
// Printing

namespace {

std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    default:
      if (c < 0x20 || c == 0x7f) {
        char buf[5];
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      } else {
        out += static_cast<char>(c);
      }
    }
  }
  return out + "\"";
}

/// Shortest digits that read back to the same double, marked as a float ("1.0", not "1").
std::string FloatText(double v) {
  if (std::isnan(v)) return "nan";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0"; // 'n': inf
  return s;
}

std::string AttrText(const AttrValue& v) {
  return KindOf(v) == AttrKind::kFloat ? FloatText(std::get<double>(v)) : AttrValueStr(v);
}

std::string TypeText(const TensorType& t) { return DTypeName(t.dtype) + t.shape.str(); }

// A node's planning notes: ` #group=G #stream=S #wait=%a,%b`, then one ` @arena+OFFSET` (or
// ` @-`) per output when any output is placed. Nothing when nothing was decided.
template <class Name>
std::string NoteText(const Node& n, const Name& name) {
  std::string out;
  const NodeNote& note = n.note();
  if (note.group >= 0) out += " #group=" + std::to_string(note.group);
  if (note.stream >= 0) out += " #stream=" + std::to_string(note.stream);
  for (size_t w = 0; w < note.waits.size(); ++w)
    out += (w ? "," : " #wait=") + (note.waits[w] && !note.waits[w]->outputs().empty()
                                        ? name(note.waits[w]->output())
                                        : std::string("%<null>"));
  bool placed = false;
  for (const Value* v : n.outputs()) placed |= v && v->note().offset >= 0;
  if (placed)
    for (const Value* v : n.outputs())
      out += v->note().offset >= 0 ? " @arena+" + std::to_string(v->note().offset) : std::string(" @-");
  return out;
}

} // namespace

std::string PrintGraph(const Graph& g) {
  std::unordered_map<const Value*, int> num;
  for (const Value* v : g.inputs()) num.emplace(v, static_cast<int>(num.size()));
  for (const auto& n : g.nodes())
    for (const Value* v : n->outputs()) num.emplace(v, static_cast<int>(num.size()));
  auto name = [&](const Value* v) {
    std::string s = "%";
    auto it = num.find(v);
    if (!v)
      s += "<null>";
    else if (it == num.end())
      s += "<foreign " + std::to_string(v->id()) + ">";
    else
      s += std::to_string(it->second);
    return s;
  };
  auto list = [&](const std::vector<Value*>& vs) {
    std::string s;
    for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + name(vs[i]);
    return s;
  };

  std::string out;
  for (const Value* v : g.inputs())
    out += name(v) + " = input " + Quote(v ? v->name() : "") + " : " + (v ? TypeText(v->type()) : "?") + "\n";
  for (const auto& n : g.nodes()) {
    out += list(n->outputs()) + " = " + n->def().name + "(" + list(n->inputs()) + ")";
    if (!n->attrs().empty()) {
      out += " {";
      const auto& items = n->attrs().items();
      for (size_t i = 0; i < items.size(); ++i)
        out += (i ? ", " : "") + std::string(items[i].first) + "=" + AttrText(items[i].second);
      out += "}";
    }
    out += " :";
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      const Value* v = n->output(static_cast<int>(i));
      out += (i ? ", " : " ") + (v ? TypeText(v->type()) : std::string("?"));
    }
    out += NoteText(*n, name);
    out += "\n";
  }
  out += "return";
  if (!g.outputs().empty()) out += " " + list(g.outputs());
  return out + "\n";
}

// ---------------------------------------------------------------------------------------------
// Parsing

namespace {

enum class Tok { kValue, kIdent, kNumber, kString, kPunct, kNewline, kEnd, kBad, kNote, kPlace };

struct Token {
  Tok kind = Tok::kEnd;
  std::string text; ///< as written (kString: the decoded contents)
  int line = 1, col = 1;
};

std::string Describe(const Token& t) {
  switch (t.kind) {
  case Tok::kNewline: return "end of line";
  case Tok::kEnd: return "end of input";
  case Tok::kNote: return "'#" + t.text + "='";
  case Tok::kPlace: return t.text == "-" ? "'@-'" : "'@arena+" + t.text + "'";
  case Tok::kString: return "string " + Quote(t.text);
  case Tok::kBad:
    return "character " +
           (std::isprint(static_cast<unsigned char>(t.text[0])) ? "'" + t.text + "'" : Quote(t.text));
  default: return "'" + t.text + "'";
  }
}

[[noreturn]] void Fail(const Token& at, const std::string& msg) {
  KILN_THROW(FormatError) << "line " << at.line << ", column " << at.col << ": " << msg;
}

[[noreturn]] void Expected(const Token& found, const std::string& what) {
  Fail(found, "expected " + what + ", found " + Describe(found));
}

bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }

class Lexer {
public:
  explicit Lexer(std::string_view s) : s_(s) {}

  const Token& Peek() {
    if (!peeked_) {
      tok_ = Lex();
      peeked_ = true;
    }
    return tok_;
  }
  Token Next() {
    Peek();
    peeked_ = false;
    return tok_;
  }

private:
  Token Lex() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r')) Advance();
    Token t;
    t.line = line_;
    t.col = col_;
    if (pos_ < s_.size() && s_[pos_] == '#') {
      // `#group=`, `#stream=`, `#wait=`: a planning note; any other '#' starts a comment.
      for (std::string_view key : {"group=", "stream=", "wait="})
        if (s_.substr(pos_ + 1, key.size()) == key) {
          for (size_t k = 0; k < key.size(); ++k) Advance();  // '#' and the key; '=' is left
          t.kind = Tok::kNote;
          t.text = std::string(key.substr(0, key.size() - 1));
          return t;
        }
      while (pos_ < s_.size() && s_[pos_] != '\n') Advance();
      t.line = line_;
      t.col = col_;
    }
    if (pos_ >= s_.size()) return t;
    char c = s_[pos_];
    size_t start = pos_;
    if (c == '\n') {
      Advance();
      t.kind = Tok::kNewline;
    } else if (c == '%' && pos_ + 1 < s_.size() && IsNameChar(s_[pos_ + 1])) {
      Advance();
      while (pos_ < s_.size() && IsNameChar(s_[pos_])) Advance();
      t.kind = Tok::kValue;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      while (pos_ < s_.size() && IsNameChar(s_[pos_])) Advance();
      t.kind = Tok::kIdent;
    } else if (std::isdigit(static_cast<unsigned char>(c)) ||
               (c == '-' && pos_ + 1 < s_.size() && IsNameChar(s_[pos_ + 1]))) {
      // Digits, letters, '.', and a sign after an exponent: "-1", "2.5e-07", "-inf".
      Advance();
      while (pos_ < s_.size() &&
             (IsNameChar(s_[pos_]) || ((s_[pos_] == '-' || s_[pos_] == '+') && (s_[pos_ - 1] | 0x20) == 'e')))
        Advance();
      t.kind = Tok::kNumber;
    } else if (c == '"') {
      return LexString(t);
    } else if (s_.substr(pos_, 7) == "@arena+" || s_.substr(pos_, 2) == "@-") {
      // A value's placement: `@arena+256` (text "256") or `@-` (text "-").
      const bool arena = s_[pos_ + 1] == 'a';
      for (int k = 0; k < (arena ? 7 : 2); ++k) Advance();
      const size_t digits = pos_;
      while (arena && pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) Advance();
      t.kind = Tok::kPlace;
      t.text = arena ? std::string(s_.substr(digits, pos_ - digits)) : "-";
      if (arena && t.text.empty()) Expected(t, "a byte offset after '@arena+'");
      return t;
    } else if (std::strchr("()[]{},=:", c)) {
      Advance();
      t.kind = Tok::kPunct;
    } else {
      Advance();
      t.kind = Tok::kBad;
    }
    t.text = std::string(s_.substr(start, pos_ - start));
    return t;
  }

  Token LexString(Token t) {
    t.kind = Tok::kString;
    Advance(); // opening quote
    while (true) {
      Token here{Tok::kEnd, "", line_, col_};
      if (pos_ >= s_.size() || s_[pos_] == '\n') {
        here.kind = pos_ >= s_.size() ? Tok::kEnd : Tok::kNewline;
        Expected(here, "'\"' to close the string");
      }
      char c = s_[pos_];
      Advance();
      if (c == '"') return t;
      if (c != '\\') {
        t.text += c;
        continue;
      }
      char e = pos_ < s_.size() ? s_[pos_] : '\0';
      if (pos_ < s_.size() && e != '\n') Advance();
      switch (e) {
      case '"': t.text += '"'; break;
      case '\\': t.text += '\\'; break;
      case 'n': t.text += '\n'; break;
      case 'r': t.text += '\r'; break;
      case 't': t.text += '\t'; break;
      case 'x': {
        int v = 0;
        bool ok = pos_ + 2 <= s_.size() &&
                  std::from_chars(s_.data() + pos_, s_.data() + pos_ + 2, v, 16).ptr == s_.data() + pos_ + 2;
        if (!ok) Fail(here, "expected two hex digits after \\x in the string");
        Advance();
        Advance();
        t.text += static_cast<char>(v);
        break;
      }
      default:
        Fail(here, std::string("expected an escape (\\\" \\\\ \\n \\r \\t \\xHH), found ") +
                       (e == '\0' || e == '\n' ? "end of line" : "'\\" + std::string(1, e) + "'"));
      }
    }
  }

  void Advance() {
    if (s_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }

  std::string_view s_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
  Token tok_;
  bool peeked_ = false;
};


const char* Article(AttrKind k) { return k == AttrKind::kInt || k == AttrKind::kInts ? "an" : "a"; }

class Parser {
public:
  explicit Parser(std::string_view text) : lex_(text), g_(std::make_unique<Graph>()) {}

  std::unique_ptr<Graph> Run() {
    while (true) {
      SkipBlankLines();
      const Token& t = lex_.Peek();
      if (t.kind == Tok::kIdent && t.text == "return") break;
      if (t.kind != Tok::kValue) Expected(t, "a definition ('%name = ...') or 'return'");
      Statement();
    }
    lex_.Next();
    std::vector<Value*> outs;
    if (lex_.Peek().kind == Tok::kValue) outs = ValueList();
    EndOfLine();
    SkipBlankLines();
    if (lex_.Peek().kind != Tok::kEnd) Expected(lex_.Peek(), "end of input after 'return'");
    g_->SetOutputs(std::move(outs));
    // The parser checks each invariant as it builds; this catches what it missed, as a format error.
    if (auto v = VerifyAll(*g_); !v.empty()) KILN_THROW(FormatError) << "parsed graph is malformed: " << v[0];
    return std::move(g_);
  }

private:
  struct Def {
    Value* value;
    int line;
  };

  void SkipBlankLines() {
    while (lex_.Peek().kind == Tok::kNewline) lex_.Next();
  }

  Token Expect(std::string_view punct) {
    Token t = lex_.Next();
    if (t.kind != Tok::kPunct || t.text != punct) Expected(t, std::string(1, '\'').append(punct).append("'"));
    return t;
  }

  bool Accept(std::string_view punct) {
    if (lex_.Peek().kind != Tok::kPunct || lex_.Peek().text != punct) return false;
    lex_.Next();
    return true;
  }

  void EndOfLine() {
    Token t = lex_.Next();
    if (t.kind != Tok::kNewline && t.kind != Tok::kEnd) Expected(t, "end of line");
  }

  Value* Use() {
    Token t = lex_.Next();
    if (t.kind != Tok::kValue) Expected(t, "a value ('%name')");
    auto it = defs_.find(t.text);
    if (it == defs_.end()) Fail(t, t.text + " is not defined; a value must be defined before its use");
    return it->second.value;
  }

  std::vector<Value*> ValueList() {
    std::vector<Value*> vs{Use()};
    while (Accept(",")) vs.push_back(Use());
    return vs;
  }

  void Define(const Token& t, Value* v) { defs_.emplace(t.text, Def{v, t.line}); }

  int64_t Int(const Token& t, const std::string& what) {
    int64_t v = 0;
    const char* end = t.text.data() + t.text.size();
    auto r = t.kind == Tok::kNumber ? std::from_chars(t.text.data(), end, v) : std::from_chars_result{};
    if (r.ec == std::errc::result_out_of_range && r.ptr == end)
      Fail(t, "expected " + what + ", found '" + t.text + "', which does not fit in 64 bits");
    if (t.kind != Tok::kNumber || r.ec != std::errc() || r.ptr != end) Expected(t, what);
    return v;
  }

  DType DTypeOf(const Token& t) {
    if (t.kind == Tok::kIdent)
      for (int i = 0; i < kNumDTypes; ++i)
        if (t.text == DTypeName(static_cast<DType>(i))) return static_cast<DType>(i);
    std::string names;
    for (int i = 0; i < kNumDTypes; ++i)
      names += (i ? ", " : "") + std::string(DTypeName(static_cast<DType>(i)));
    Expected(t, "a dtype (" + names + ")");
  }

  TensorType Type() {
    TensorType type;
    type.dtype = DTypeOf(lex_.Next());
    Expect("(");
    std::vector<int64_t> dims;
    if (Accept(")")) return type;
    while (true) {
      Token t = lex_.Next();
      int64_t d = Int(t, dims.empty() ? "a dimension or ')'" : "a dimension");
      if (d < 0) Fail(t, "expected a dimension (an integer >= 0), found '" + t.text + "'");
      if (static_cast<int>(dims.size()) == kMaxRank)
        Fail(t, "expected ')' after at most " + std::to_string(kMaxRank) + " dimensions, found '" + t.text +
                    "'");
      dims.push_back(d);
      if (Accept(")")) break;
      Token sep = lex_.Next();
      if (sep.kind != Tok::kPunct || sep.text != ",") Expected(sep, "',' or ')'");
      if (Accept(")")) break; // "(5,)"
    }
    type.shape = Shape(dims);
    return type;
  }

  // An attribute value as written; OpDef::Resolve checks it against the schema afterwards.
  AttrValue AttrLiteral() {
    Token t = lex_.Next();
    if (t.kind == Tok::kPunct && t.text == "[") {
      std::vector<int64_t> xs;
      if (Accept("]")) return xs;
      do xs.push_back(Int(lex_.Next(), "an integer"));
      while (Accept(","));
      Token close = lex_.Next();
      if (close.kind != Tok::kPunct || close.text != "]") Expected(close, "',' or ']'");
      return xs;
    }
    if (t.kind == Tok::kIdent) {
      if (t.text == "true" || t.text == "false") return t.text == "true";
      if (t.text == "inf" || t.text == "nan") return t.text == "inf" ? HUGE_VAL : std::nan("");
      for (int i = 0; i < kNumDTypes; ++i)
        if (t.text == DTypeName(static_cast<DType>(i))) return static_cast<DType>(i);
    }
    if (t.kind == Tok::kNumber) {
      if (t.text.find_first_of(".eEn") == std::string::npos) return Int(t, "an integer");
      double d = 0;
      const char* end = t.text.data() + t.text.size();
      auto r = std::from_chars(t.text.data(), end, d);
      if (r.ptr == end && r.ec == std::errc()) return d;
      if (r.ptr == end && r.ec == std::errc::result_out_of_range)
        Fail(t, "expected a float, found '" + t.text + "', which is out of the range of a double");
    }
    Expected(t, "an attribute value (integer, float, true, false, dtype or [integers])");
  }

  void Statement() {
    std::vector<Token> results{lex_.Next()};
    while (Accept(",")) {
      Token t = lex_.Next();
      if (t.kind != Tok::kValue) Expected(t, "a value ('%name')");
      results.push_back(t);
    }
    for (size_t i = 0; i < results.size(); ++i) {
      if (auto it = defs_.find(results[i].text); it != defs_.end())
        Fail(results[i], results[i].text + " is already defined on line " + std::to_string(it->second.line));
      for (size_t j = 0; j < i; ++j)
        if (results[j].text == results[i].text) Fail(results[i], results[i].text + " is named twice");
    }
    Expect("=");
    Token op = lex_.Next();
    if (op.kind != Tok::kIdent) Expected(op, "an op name or 'input'");
    if (op.text == "input") return Input(results, op);
    Node(results, op);
  }

  void Input(const std::vector<Token>& results, const Token& kw) {
    if (results.size() != 1)
      Fail(results[1], "expected one value for 'input', found " + std::to_string(results.size()));
    Token name = lex_.Next();
    if (name.kind != Tok::kString) Expected(name, "the input's name as a string");
    if (name.text.empty()) Fail(name, "expected a non-empty input name, found \"\"");
    if (auto it = input_lines_.find(name.text); it != input_lines_.end())
      Fail(name, "input name " + Quote(name.text) + " is already used on line " + std::to_string(it->second));
    Expect(":");
    TensorType type = Type();
    EndOfLine();
    input_lines_.emplace(name.text, name.line);
    Define(results[0], g_->AddInput(name.text, type));
  }

  void Node(const std::vector<Token>& results, const Token& op_tok) {
    std::optional<OpId> id = OpTable::Get().TryFind(op_tok.text);
    if (!id) Fail(op_tok, "unknown op '" + op_tok.text + "'; did you mean '" + ClosestOpName(op_tok.text) + "'?");
    const OpDef& def = GetOp(*id);
    Expect("(");
    std::vector<Value*> operands;
    if (!Accept(")")) {
      operands = ValueList();
      Token close = lex_.Next();
      if (close.kind != Tok::kPunct || close.text != ")") Expected(close, "',' or ')'");
    }
    Attrs attrs;
    if (Accept("{") && !Accept("}")) {
      do Attr(def, attrs);
      while (Accept(","));
      Token close = lex_.Next();
      if (close.kind != Tok::kPunct || close.text != "}") Expected(close, "',' or '}'");
    }
    Expect(":");
    std::vector<std::pair<Token, TensorType>> types;
    while (true) {
      Token at = lex_.Peek();
      TensorType type = Type();
      types.emplace_back(at, type);
      if (types.size() == results.size()) break;
      if (!Accept(",")) Expected(lex_.Peek(), "',' and a type for " + results[types.size()].text);
    }
    if (lex_.Peek().kind == Tok::kPunct && lex_.Peek().text == ",")
      Fail(lex_.Peek(), "expected end of line after " + std::to_string(results.size()) +
                            " type(s), one per result, found ','");
    NodeNote note;
    std::vector<int64_t> places;
    std::optional<Token> first_place;
    while (lex_.Peek().kind == Tok::kNote) {
      Token key = lex_.Next();
      Expect("=");
      if (key.text == "wait") {
        for (Value* v : ValueList()) {
          if (!v->node()) Fail(key, "#wait= names " + std::string("a graph input; expected node results"));
          note.waits.push_back(v->node());
        }
      } else {
        Token t = lex_.Next();
        int64_t x = Int(t, "a number after '#" + key.text + "='");
        if (x < 0 || x > INT32_MAX) Fail(t, "expected #" + key.text + "= from 0 to 2^31-1, found " + t.text);
        (key.text == "group" ? note.group : note.stream) = static_cast<int>(x);
      }
    }
    while (lex_.Peek().kind == Tok::kPlace) {
      Token t = lex_.Next();
      if (!first_place) first_place = t;
      int64_t x = -1;
      if (t.text != "-") {
        auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), x);
        if (r.ec != std::errc()) Fail(t, "expected a byte offset that fits in 64 bits, found " + t.text);
      }
      places.push_back(x);
    }
    if (!places.empty() && places.size() != results.size())
      Fail(*first_place, "expected one placement ('@arena+N' or '@-') per result, " +
                             std::to_string(results.size()) + ", found " + std::to_string(places.size()));
    EndOfLine();

    ir::Node* n = nullptr;
    try {
      n = g_->AddNode(*id, std::move(operands), attrs);
    } catch (const Error& e) {
      Fail(op_tok, e.what());
    }
    std::string node_name;
    for (size_t i = 0; i < results.size(); ++i) node_name += (i ? ", " : "") + results[i].text;
    node_name = "node " + node_name + " (" + def.name + ")";
    if (n->outputs().size() != results.size())
      Fail(results[0], node_name + ": expected " + std::to_string(n->outputs().size()) +
                           " result value(s), one per " + "output of " + def.name + ", found " +
                           std::to_string(results.size()));
    for (size_t i = 0; i < results.size(); ++i) {
      const TensorType& inferred = n->output(static_cast<int>(i))->type();
      if (types[i].second != inferred)
        Fail(types[i].first, node_name + ": " + results[i].text + " is annotated " +
                                 TypeText(types[i].second) + ", but " + def.name + " infers " +
                                 TypeText(inferred));
      Define(results[i], n->output(static_cast<int>(i)));
      if (!places.empty()) n->output(static_cast<int>(i))->note().offset = places[i];
    }
    n->note() = std::move(note);
  }

  // One `name=value`, keyed by the schema's own name (Attrs keeps the pointer) and checked for
  // kind here so the error points at the value; the coercions are those of OpDef::Resolve.
  void Attr(const OpDef& def, Attrs& attrs) {
    Token name = lex_.Next();
    if (name.kind != Tok::kIdent) Expected(name, "an attribute name");
    const AttrSpec* spec = nullptr;
    std::string known;
    for (const AttrSpec& s : def.attrs) {
      if (name.text == s.name) spec = &s;
      known += (known.empty() ? "" : ", ") + std::string(s.name);
    }
    if (!spec)
      Fail(name, def.name + " has no attribute '" + name.text +
                     "'; expected one of: " + (known.empty() ? "(none)" : known));
    if (attrs.Has(spec->name)) Fail(name, "attribute '" + name.text + "' is given twice");
    Expect("=");
    Token at = lex_.Peek();
    AttrValue v = AttrLiteral();
    AttrKind k = KindOf(v);
    bool ok = k == spec->kind || (spec->kind == AttrKind::kFloat && k == AttrKind::kInt) ||
              (spec->kind == AttrKind::kInts && k == AttrKind::kInt) ||
              (spec->kind == AttrKind::kInt && k == AttrKind::kBool);
    if (!ok)
      Fail(at, def.name + ": attribute '" + name.text + "' expects " + Article(spec->kind) + " " +
                   AttrKindName(spec->kind) + ", found " + Article(k) + " " + AttrKindName(k) + " (" +
                   AttrText(v) + ")");
    attrs.items().emplace_back(spec->name, std::move(v));
  }

  Lexer lex_;
  std::unique_ptr<Graph> g_;
  std::unordered_map<std::string, Def> defs_;
  std::unordered_map<std::string, int> input_lines_;
};

} // namespace

std::unique_ptr<Graph> ParseGraph(std::string_view text) { return Parser(text).Run(); }

} // namespace kiln::ir
