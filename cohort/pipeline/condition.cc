// Templates and conditions (see condition.h). Thread-safety: pure functions.
#include "cohort/pipeline/condition.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <regex>

#include "cohort/base/strings.h"

namespace cohort::pipeline {

std::string Ref::ToString() const {
  return kind == Kind::kParam ? "params." + param : "steps." + step + ".outputs." + output;
}

Result<Ref> ParseRef(const std::string& inner) {
  std::string text(Trim(inner));
  static const std::regex param_re(R"(params\.([A-Za-z_][A-Za-z0-9_-]*))");
  static const std::regex output_re(
      R"(steps\.([A-Za-z0-9_][A-Za-z0-9_-]*)\.outputs\.([A-Za-z_][A-Za-z0-9_-]*))");
  std::smatch m;
  Ref ref;
  if (std::regex_match(text, m, param_re)) {
    ref.kind = Ref::Kind::kParam;
    ref.param = m[1];
    return ref;
  }
  if (std::regex_match(text, m, output_re)) {
    ref.kind = Ref::Kind::kStepOutput;
    ref.step = m[1];
    ref.output = m[2];
    return ref;
  }
  return InvalidArgument(
      "'{{{{{}}}}}' is not a template (write {{{{params.NAME}}}} or "
      "{{{{steps.STEP.outputs.NAME}}}})",
      text);
}

Result<std::vector<TemplateUse>> FindTemplates(const std::string& text) {
  std::vector<TemplateUse> uses;
  size_t pos = 0;
  for (;;) {
    size_t open = text.find("{{", pos);
    if (open == std::string::npos) break;
    size_t close = text.find("}}", open + 2);
    if (close == std::string::npos) {
      return InvalidArgument("'{{{{' at offset {} is never closed with '}}}}'", open);
    }
    COHORT_ASSIGN_OR_RETURN(Ref ref, ParseRef(text.substr(open + 2, close - open - 2)));
    uses.push_back({open, close + 2, std::move(ref)});
    pos = close + 2;
  }
  return uses;
}

Result<std::string> SubstituteTemplates(
    const std::string& text, const std::function<Result<std::string>(const Ref&)>& lookup) {
  COHORT_ASSIGN_OR_RETURN(auto uses, FindTemplates(text));
  std::string out;
  size_t pos = 0;
  for (const auto& use : uses) {
    out.append(text, pos, use.begin - pos);
    COHORT_ASSIGN_OR_RETURN(std::string value, lookup(use.ref));
    out += value;
    pos = use.end;
  }
  out.append(text, pos, std::string::npos);
  return out;
}

Result<std::string> SubstituteTemplatesInYaml(
    const std::string& text, const std::function<Result<std::string>(const Ref&)>& lookup) {
  COHORT_ASSIGN_OR_RETURN(auto uses, FindTemplates(text));
  if (uses.empty()) return text;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument("line {}, column {}: YAML syntax error: {}", e.mark.line + 1,
                           e.mark.column + 1, e.msg);
  }
  Status status;
  size_t filled = 0;  // templates found in scalar values
  // A YAML alias (*x) is the node its anchor (&x) names: each node is filled in once, or a
  // value would be filled in again (its text read as templates) and counted twice.
  std::vector<YAML::Node> seen;
  // Nodes are references into the document: assigning to one changes it in place.
  std::function<void(YAML::Node, int)> fill = [&](YAML::Node node, int depth) {
    if (!status.ok()) return;
    if (depth > 256) {
      status = InvalidArgument("the document nests deeper than 256 levels");
      return;
    }
    for (const auto& s : seen) {
      if (s.is(node)) return;
    }
    seen.push_back(node);
    if (node.IsScalar()) {
      if (node.Scalar().find("{{") == std::string::npos) return;
      auto inner = FindTemplates(node.Scalar());
      if (inner.ok()) filled += inner->size();
      auto value = SubstituteTemplates(node.Scalar(), lookup);
      if (!value.ok()) {
        status = value.status();
        return;
      }
      node = *value;
    } else if (node.IsSequence()) {
      for (YAML::Node child : node) fill(child, depth + 1);
    } else if (node.IsMap()) {
      // `key: {{params.n}}` unquoted is YAML for a mapping whose one key is the mapping
      // {params.n: null}: the template is the whole value, filled in as one scalar.
      if (node.size() == 1) {
        auto entry = *node.begin();
        if (entry.first.IsMap() && entry.first.size() == 1 && entry.second.IsNull()) {
          auto inner = *entry.first.begin();
          if (inner.first.IsScalar() && inner.second.IsNull()) {
            auto ref = ParseRef(inner.first.Scalar());
            if (ref.ok()) {
              auto value = lookup(*ref);
              if (!value.ok()) {
                status = value.status();
                return;
              }
              ++filled;
              node = *value;
              return;
            }
          }
        }
      }
      for (auto entry : node) fill(entry.second, depth + 1);
    }
  };
  fill(root, 0);
  COHORT_RETURN_IF_ERROR(status);
  if (filled < uses.size()) {
    // A template outside any string value (unquoted, "{{...}}" is a YAML flow mapping; or
    // in a key or a comment): it cannot be filled in as data.
    return InvalidArgument("{} of its {} template(s) are not inside a string value (unquoted, "
                           "{{{{...}}}} is a YAML mapping; or in a key or a comment); quote each, "
                           "e.g. \"{{{{{}}}}}\", so that it is filled in as one value",
                           uses.size() - filled, uses.size(), uses[0].ref.ToString());
  }
  YAML::Emitter out;
  out << root;
  if (!out.good()) return Internal("cannot write the filled-in document: {}", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

Value Value::String(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.text = std::move(s);
  return v;
}
Value Value::Number(double d) {
  Value v;
  v.kind = Kind::kNumber;
  v.number = d;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.boolean = b;
  return v;
}
std::string Value::ToString() const {
  switch (kind) {
    case Kind::kString: return text;
    case Kind::kNumber: return fmt::format("{}", number);
    case Kind::kBool: return boolean ? "true" : "false";
  }
  return text;
}

namespace {

struct Token {
  enum class Kind { kEnd, kTemplate, kString, kNumber, kWord, kOp, kLParen, kRParen };
  Kind kind = Kind::kEnd;
  std::string text;  // operator, word, string contents, number text
  Ref ref;
  size_t column = 0;  // 1-based
};

Result<std::vector<Token>> Tokenize(const std::string& s) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    Token t;
    t.column = i + 1;
    if (s.compare(i, 2, "{{") == 0) {
      size_t close = s.find("}}", i + 2);
      if (close == std::string::npos) {
        return InvalidArgument("column {}: '{{{{' is never closed with '}}}}'", t.column);
      }
      auto ref = ParseRef(s.substr(i + 2, close - i - 2));
      if (!ref.ok()) return InvalidArgument("column {}: {}", t.column, ref.status().message());
      t.kind = Token::Kind::kTemplate;
      t.ref = *ref;
      t.text = s.substr(i, close + 2 - i);
      i = close + 2;
    } else if (c == '\'' || c == '"') {
      size_t close = s.find(c, i + 1);
      if (close == std::string::npos) {
        return InvalidArgument("column {}: string starting with {} is never closed", t.column, c);
      }
      t.kind = Token::Kind::kString;
      t.text = s.substr(i + 1, close - i - 1);
      i = close + 1;
    } else if (std::isdigit(static_cast<unsigned char>(c)) ||
               ((c == '-' || c == '.') && i + 1 < s.size() &&
                std::isdigit(static_cast<unsigned char>(s[i + 1])))) {
      size_t j = i + 1;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '.' ||
                              ((s[j] == '-' || s[j] == '+') && (s[j - 1] == 'e' || s[j - 1] == 'E')))) {
        ++j;
      }
      t.kind = Token::Kind::kNumber;
      t.text = s.substr(i, j - i);
      if (!ParseDouble(t.text)) {
        return InvalidArgument("column {}: '{}' is not a number", t.column, t.text);
      }
      i = j;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i + 1;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      t.kind = Token::Kind::kWord;
      t.text = s.substr(i, j - i);
      i = j;
    } else if (c == '(' || c == ')') {
      t.kind = c == '(' ? Token::Kind::kLParen : Token::Kind::kRParen;
      t.text = std::string(1, c);
      ++i;
    } else {
      static const char* kOps[] = {"==", "!=", "<=", ">=", "&&", "||", "<", ">", "!"};
      bool found = false;
      for (const char* op : kOps) {
        size_t n = std::char_traits<char>::length(op);
        if (s.compare(i, n, op) == 0) {
          t.kind = Token::Kind::kOp;
          t.text = op;
          i += n;
          found = true;
          break;
        }
      }
      if (!found) {
        std::string hint = c == '=' ? " (write '==' to compare)"
                           : c == '&' ? " (write '&&')"
                           : c == '|' ? " (write '||')"
                                      : "";
        return InvalidArgument("column {}: unexpected character '{}'{}", t.column, c, hint);
      }
    }
    out.push_back(std::move(t));
  }
  Token end;
  end.column = s.size() + 1;
  out.push_back(end);
  return out;
}

// Bounds that keep parsing, evaluation and destruction (all recursive) far from the stack's
// end: a condition is a line of a pipeline spec, not a program.
constexpr size_t kMaxConditionTokens = 1024;
constexpr int kMaxConditionDepth = 64;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Result<std::unique_ptr<Expr>> Parse() {
    if (tokens_.size() > kMaxConditionTokens) {
      return InvalidArgument("the condition has {} tokens; at most {} are allowed",
                             tokens_.size() - 1, kMaxConditionTokens);
    }
    COHORT_ASSIGN_OR_RETURN(auto e, Or());
    if (Peek().kind != Token::Kind::kEnd) {
      return Error(Peek(), "expected an operator or the end of the condition");
    }
    return e;
  }

 private:
  const Token& Peek() const { return tokens_[pos_]; }
  bool IsOp(const char* op) const {
    return Peek().kind == Token::Kind::kOp && Peek().text == op;
  }
  static Status Error(const Token& t, const std::string& what) {
    std::string got = t.kind == Token::Kind::kEnd ? "the end" : "'" + t.text + "'";
    return InvalidArgument("column {}: {}, found {}", t.column, what, got);
  }
  static std::unique_ptr<Expr> Binary(Expr::Op op, std::unique_ptr<Expr> l,
                                      std::unique_ptr<Expr> r) {
    auto e = std::make_unique<Expr>();
    e->op = op;
    e->lhs = std::move(l);
    e->rhs = std::move(r);
    return e;
  }

  // One left-associative level of binary operators: operands parsed by `operand`, joined
  // by the operator `text` into `op` nodes.
  Result<std::unique_ptr<Expr>> Chain(const char* text, Expr::Op op,
                                      Result<std::unique_ptr<Expr>> (Parser::*operand)()) {
    COHORT_ASSIGN_OR_RETURN(auto l, (this->*operand)());
    while (IsOp(text)) {
      ++pos_;
      COHORT_ASSIGN_OR_RETURN(auto r, (this->*operand)());
      l = Binary(op, std::move(l), std::move(r));
    }
    return l;
  }
  Result<std::unique_ptr<Expr>> Or() { return Chain("||", Expr::Op::kOr, &Parser::And); }
  Result<std::unique_ptr<Expr>> And() { return Chain("&&", Expr::Op::kAnd, &Parser::Unary); }
  // Counts one level of '!' or '(' nesting for as long as it lives.
  struct Nested {
    explicit Nested(int& depth) : depth_(depth) { ++depth_; }
    ~Nested() { --depth_; }
    int& depth_;
  };
  Status TooDeep(const Token& t) const {
    return InvalidArgument("column {}: the condition nests '!' and '(' more than {} levels deep",
                           t.column, kMaxConditionDepth);
  }

  Result<std::unique_ptr<Expr>> Unary() {
    if (IsOp("!")) {
      Nested level(depth_);
      if (depth_ > kMaxConditionDepth) return TooDeep(Peek());
      ++pos_;
      COHORT_ASSIGN_OR_RETURN(auto operand, Unary());
      auto e = std::make_unique<Expr>();
      e->op = Expr::Op::kNot;
      e->lhs = std::move(operand);
      return e;
    }
    return Compare();
  }
  Result<std::unique_ptr<Expr>> Compare() {
    COHORT_ASSIGN_OR_RETURN(auto l, Primary());
    static const std::pair<const char*, Expr::Op> kCmp[] = {
        {"==", Expr::Op::kEq}, {"!=", Expr::Op::kNe}, {"<", Expr::Op::kLt},
        {"<=", Expr::Op::kLe}, {">", Expr::Op::kGt},  {">=", Expr::Op::kGe}};
    for (const auto& [text, op] : kCmp) {
      if (IsOp(text)) {
        ++pos_;
        COHORT_ASSIGN_OR_RETURN(auto r, Primary());
        return Binary(op, std::move(l), std::move(r));
      }
    }
    return l;
  }
  Result<std::unique_ptr<Expr>> Primary() {
    const Token& t = Peek();
    auto e = std::make_unique<Expr>();
    switch (t.kind) {
      case Token::Kind::kLParen: {
        Nested level(depth_);
        if (depth_ > kMaxConditionDepth) return TooDeep(t);
        ++pos_;
        COHORT_ASSIGN_OR_RETURN(auto inner, Or());
        if (Peek().kind != Token::Kind::kRParen) return Error(Peek(), "expected ')'");
        ++pos_;
        return inner;
      }
      case Token::Kind::kTemplate:
        e->op = Expr::Op::kRef;
        e->ref = t.ref;
        break;
      case Token::Kind::kString:
        e->literal = Value::String(t.text);
        break;
      case Token::Kind::kNumber:
        e->literal = Value::Number(*ParseDouble(t.text));
        break;
      case Token::Kind::kWord:
        if (t.text == "true" || t.text == "false") {
          e->literal = Value::Bool(t.text == "true");
          break;
        }
        return InvalidArgument(
            "column {}: '{}' is not a value (quote strings: '{}'; references are "
            "{{{{params.NAME}}}})",
            t.column, t.text, t.text);
      default:
        return Error(t, "expected a value ({{params.X}}, a 'string', a number, true or false)");
    }
    ++pos_;
    return e;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

std::optional<double> AsNumber(const Value& v) {
  if (v.kind == Value::Kind::kNumber) return v.number;
  if (v.kind == Value::Kind::kString) return ParseDouble(std::string(Trim(v.text)));
  return std::nullopt;
}

Result<bool> AsBool(const Value& v, const std::string& what) {
  if (v.kind == Value::Kind::kBool) return v.boolean;
  if (v.kind == Value::Kind::kString) {
    std::string t = ToLower(Trim(v.text));
    if (t == "true") return true;
    if (t == "false") return false;
  }
  return InvalidArgument("{} is '{}', not true or false", what, v.ToString());
}

Result<Value> Eval(const Expr& e, const RefResolver& resolve);

Result<bool> EvalBool(const Expr& e, const RefResolver& resolve) {
  COHORT_ASSIGN_OR_RETURN(Value v, Eval(e, resolve));
  return AsBool(v, e.op == Expr::Op::kRef ? e.ref.ToString() : "an operand");
}

Result<Value> Eval(const Expr& e, const RefResolver& resolve) {
  switch (e.op) {
    case Expr::Op::kLiteral: return e.literal;
    case Expr::Op::kRef: return resolve(e.ref);
    case Expr::Op::kNot: {
      COHORT_ASSIGN_OR_RETURN(bool b, EvalBool(*e.lhs, resolve));
      return Value::Bool(!b);
    }
    case Expr::Op::kAnd: {
      COHORT_ASSIGN_OR_RETURN(bool l, EvalBool(*e.lhs, resolve));
      if (!l) return Value::Bool(false);
      COHORT_ASSIGN_OR_RETURN(bool r, EvalBool(*e.rhs, resolve));
      return Value::Bool(r);
    }
    case Expr::Op::kOr: {
      COHORT_ASSIGN_OR_RETURN(bool l, EvalBool(*e.lhs, resolve));
      if (l) return Value::Bool(true);
      COHORT_ASSIGN_OR_RETURN(bool r, EvalBool(*e.rhs, resolve));
      return Value::Bool(r);
    }
    default: break;
  }
  COHORT_ASSIGN_OR_RETURN(Value l, Eval(*e.lhs, resolve));
  COHORT_ASSIGN_OR_RETURN(Value r, Eval(*e.rhs, resolve));
  auto ln = AsNumber(l), rn = AsNumber(r);
  bool numeric = ln && rn && (l.kind == Value::Kind::kNumber || r.kind == Value::Kind::kNumber ||
                              (e.op != Expr::Op::kEq && e.op != Expr::Op::kNe));
  if (e.op == Expr::Op::kEq || e.op == Expr::Op::kNe) {
    bool equal;
    if (numeric) {
      equal = *ln == *rn;
    } else if (l.kind == Value::Kind::kBool || r.kind == Value::Kind::kBool) {
      auto lb = AsBool(l, "the left side"), rb = AsBool(r, "the right side");
      if (!lb.ok()) return lb.status();
      if (!rb.ok()) return rb.status();
      equal = *lb == *rb;
    } else {
      equal = l.ToString() == r.ToString();
    }
    return Value::Bool(e.op == Expr::Op::kEq ? equal : !equal);
  }
  if (!ln || !rn) {
    return InvalidArgument("cannot order '{}' and '{}': both must be numbers", l.ToString(),
                           r.ToString());
  }
  switch (e.op) {
    case Expr::Op::kLt: return Value::Bool(*ln < *rn);
    case Expr::Op::kLe: return Value::Bool(*ln <= *rn);
    case Expr::Op::kGt: return Value::Bool(*ln > *rn);
    case Expr::Op::kGe: return Value::Bool(*ln >= *rn);
    default: break;
  }
  return Internal("unknown operator");
}

const char* OpText(Expr::Op op) {
  switch (op) {
    case Expr::Op::kAnd: return "&&";
    case Expr::Op::kOr: return "||";
    case Expr::Op::kEq: return "==";
    case Expr::Op::kNe: return "!=";
    case Expr::Op::kLt: return "<";
    case Expr::Op::kLe: return "<=";
    case Expr::Op::kGt: return ">";
    case Expr::Op::kGe: return ">=";
    default: return "?";
  }
}

}  // namespace

Result<std::unique_ptr<Expr>> ParseCondition(const std::string& text) {
  if (Trim(text).empty()) return InvalidArgument("empty condition");
  COHORT_ASSIGN_OR_RETURN(auto tokens, Tokenize(text));
  return Parser(std::move(tokens)).Parse();
}

void CollectRefs(const Expr& expr, std::vector<Ref>* refs) {
  if (expr.op == Expr::Op::kRef) refs->push_back(expr.ref);
  if (expr.lhs) CollectRefs(*expr.lhs, refs);
  if (expr.rhs) CollectRefs(*expr.rhs, refs);
}

Result<bool> EvaluateCondition(const Expr& expr, const RefResolver& resolve) {
  return EvalBool(expr, resolve);
}

std::string ToArgoCondition(const Expr& e, const std::function<bool(const Ref&)>& is_text) {
  auto ref_text = [&](const Ref& ref, bool quote) {
    const std::string t = ref.kind == Ref::Kind::kParam
                              ? "{{workflow.parameters." + ref.param + "}}"
                              : "{{tasks." + ref.step + ".outputs.parameters." + ref.output + "}}";
    return quote ? "'" + t + "'" : t;
  };
  auto is_number = [](const Expr& x) {
    return x.op == Expr::Op::kLiteral && x.literal.kind == Value::Kind::kNumber;
  };
  // One side of a comparison whose other side is `other`.
  auto operand = [&](const Expr& x, const Expr& other) {
    if (x.op == Expr::Op::kRef) return ref_text(x.ref, is_text(x.ref) && !is_number(other));
    return ToArgoCondition(x, is_text);
  };
  switch (e.op) {
    case Expr::Op::kLiteral: {
      if (e.literal.kind != Value::Kind::kString) return e.literal.ToString();
      static const std::regex word("[A-Za-z][A-Za-z0-9_]*");
      const std::string& s = e.literal.text;
      if (std::regex_match(s, word) && s != "true" && s != "false") return s;
      std::string quoted = "'";
      for (char c : s) quoted += c == '\'' ? std::string("\\'") : std::string(1, c);
      return quoted + "'";
    }
    case Expr::Op::kRef:
      return ref_text(e.ref, false);  // a boolean on its own
    case Expr::Op::kNot: return "!(" + ToArgoCondition(*e.lhs, is_text) + ")";
    case Expr::Op::kAnd:
    case Expr::Op::kOr: {
      auto side = [&](const Expr& x) {
        std::string s = ToArgoCondition(x, is_text);
        return (x.op == Expr::Op::kAnd || x.op == Expr::Op::kOr) && x.op != e.op ? "(" + s + ")"
                                                                               : s;
      };
      return side(*e.lhs) + " " + OpText(e.op) + " " + side(*e.rhs);
    }
    default:
      return operand(*e.lhs, *e.rhs) + " " + OpText(e.op) + " " + operand(*e.rhs, *e.lhs);
  }
}

}  // namespace cohort::pipeline
