// Pipeline expressions: the `{{...}}` templates of commands and env, and the `when:`
// conditions of steps.
//
// Templates: `{{params.NAME}}` (a pipeline parameter) and `{{steps.STEP.outputs.NAME}}` (a
// small value a finished step wrote to $COHORT_OUTPUTS/NAME).
//
// Conditions: a boolean expression over templates and literals:
//   expr    := or
//   or      := and ('||' and)*
//   and     := unary ('&&' unary)*
//   unary   := '!' unary | compare
//   compare := primary (('=='|'!='|'<'|'<='|'>'|'>=') primary)?
//   primary := '(' expr ')' | TEMPLATE | 'string' | "string" | NUMBER | true | false
// Comparisons are numeric when both sides are numbers (a string that reads as a number
// counts), else textual for == and !=; ordering a non-number is an error at evaluation.
//
// Thread-safety: an Expr is immutable after parsing and may be evaluated from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/base/status.h"

namespace cohort::pipeline {

// A reference inside `{{...}}`.
struct Ref {
  enum class Kind { kParam, kStepOutput };
  Kind kind = Kind::kParam;
  std::string param;   // kParam
  std::string step;    // kStepOutput
  std::string output;  // kStepOutput
  std::string ToString() const;  // "params.x" / "steps.s.outputs.o"
};

// Parses the text between the braces ("params.x", " steps.a.outputs.b ").
Result<Ref> ParseRef(const std::string& inner);

// One `{{...}}` occurrence in a text: its byte range (braces included) and reference.
struct TemplateUse {
  size_t begin = 0, end = 0;
  Ref ref;
};
// Every template in `text`; an error names the first malformed one (unclosed braces, an
// unknown form such as {{workflow.x}}).
Result<std::vector<TemplateUse>> FindTemplates(const std::string& text);

// Replaces every template by `lookup(ref)`; the first lookup error is returned.
Result<std::string> SubstituteTemplates(
    const std::string& text, const std::function<Result<std::string>(const Ref&)>& lookup);

// The same for a YAML document (a job spec): the text is parsed first and the templates of
// each scalar value are filled in there, so a value is always data in the field that named
// it: "1\nmax_restarts: 50" stays one string, it never adds a field. The result is the
// document written out again (text without templates is returned as it is).
// kInvalidArgument for text that is not YAML.
Result<std::string> SubstituteTemplatesInYaml(
    const std::string& text, const std::function<Result<std::string>(const Ref&)>& lookup);

// A typed value: parameters carry their declared type, step outputs are strings.
struct Value {
  enum class Kind { kString, kNumber, kBool };
  Kind kind = Kind::kString;
  std::string text;
  double number = 0;
  bool boolean = false;
  static Value String(std::string s);
  static Value Number(double d);
  static Value Bool(bool b);
  std::string ToString() const;
};

class Expr {
 public:
  enum class Op { kLiteral, kRef, kNot, kAnd, kOr, kEq, kNe, kLt, kLe, kGt, kGe };
  Op op = Op::kLiteral;
  Value literal;                    // kLiteral
  Ref ref;                          // kRef
  std::unique_ptr<Expr> lhs, rhs;   // operands (kNot: lhs only)
};

// Parses a condition; the error says what was expected and at which column (1-based).
Result<std::unique_ptr<Expr>> ParseCondition(const std::string& text);

// Every reference in the expression, in order of appearance.
void CollectRefs(const Expr& expr, std::vector<Ref>* refs);

using RefResolver = std::function<Result<Value>(const Ref&)>;
// Evaluates to a boolean; a reference that cannot be resolved or a type error is an error.
Result<bool> EvaluateCondition(const Expr& expr, const RefResolver& resolve);

// Argo's form of the condition: references become {{workflow.parameters.X}} and
// {{tasks.S.outputs.parameters.O}}; string literals stay bare words when they are plain
// words ([A-Za-z][A-Za-z0-9_]*, as Argo's examples write them: `... == slurm`) and are
// single-quoted otherwise. Argo substitutes the text, then reads bare words as strings but
// `us-east-1` as a subtraction: so a reference `is_text` says holds text is single-quoted
// too ('{{workflow.parameters.region}}' == 'us-east-1'), unless it is compared with a number
// (then it stays bare, and Argo compares numbers).
std::string ToArgoCondition(const Expr& expr, const std::function<bool(const Ref&)>& is_text);

}  // namespace cohort::pipeline
