// Tests of cohort/pipeline without the CLI: spec parsing and every kind of bad input (with
// its location), conditions (parsing, evaluation, Argo form), topological order and cycles,
// template resolution, cache keys, the local executor on real processes (parallelism,
// retries, timeouts, failure propagation, caching, resume), and the Argo export (structure,
// and the schema of @kubernetes-models/argo-workflows through tests/k8s/validate-argo.mjs
// when node and tests/k8s/node_modules are present).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cohort/base/subprocess.h"
#include "cohort/base/temp_dir.h"
#include "cohort/launch/yaml_emit.h"
#include "cohort/pipeline/argo.h"
#include "cohort/pipeline/condition.h"
#include "cohort/pipeline/executor.h"
#include "cohort/pipeline/pipeline_spec.h"
#include "cohort/pipeline/run_db.h"

namespace cohort::pipeline {
namespace {

namespace fs = std::filesystem;

std::string AllProblems(const std::vector<Problem>& problems) {
  return launch::FormatProblems(problems);
}

bool Has(const std::vector<Problem>& problems, const std::string& where,
         const std::string& what) {
  for (const auto& p : problems) {
    if (p.where == where && p.what.find(what) != std::string::npos) return true;
  }
  return false;
}

PipelineSpec Parse(const std::string& yaml, std::vector<Problem>* problems,
                   const std::string& base = "/tmp") {
  return ParsePipelineSpec(yaml, base, problems);
}

// ---------------------------------------------------------------------------------------
// Conditions

Result<bool> Eval(const std::string& text, const std::map<std::string, Value>& values) {
  auto e = ParseCondition(text);
  if (!e.ok()) return e.status();
  return EvaluateCondition(**e, [&](const Ref& r) -> Result<Value> {
    auto it = values.find(r.ToString());
    if (it == values.end()) return NotFound("no {}", r.ToString());
    return it->second;
  });
}

TEST(PipelineConditionTest, EvaluatesOperatorsAndPrecedence) {
  std::map<std::string, Value> v = {{"params.runtime", Value::String("slurm")},
                                    {"params.epochs", Value::Number(3)},
                                    {"params.fast", Value::Bool(true)},
                                    {"steps.prep.outputs.samples", Value::String("60000")}};
  EXPECT_TRUE(*Eval("{{params.runtime}} == 'slurm'", v));
  EXPECT_FALSE(*Eval("{{params.runtime}} != \"slurm\"", v));
  EXPECT_TRUE(*Eval("{{params.epochs}} >= 3 && {{params.epochs}} < 4", v));
  EXPECT_FALSE(*Eval("{{params.epochs}} > 3", v));
  EXPECT_TRUE(*Eval("{{params.epochs}} <= 3.0", v));
  EXPECT_TRUE(*Eval("{{steps.prep.outputs.samples}} > 59999", v));  // numeric string
  EXPECT_TRUE(*Eval("{{params.fast}}", v));
  EXPECT_TRUE(*Eval("{{params.fast}} == true", v));
  EXPECT_FALSE(*Eval("!{{params.fast}}", v));
  EXPECT_TRUE(*Eval("false || true && true", v));          // && binds tighter
  EXPECT_FALSE(*Eval("(false || true) && false", v));
  EXPECT_TRUE(*Eval("!(1 > 2) && (2 < 3 || false)", v));
  EXPECT_FALSE(Eval("!(1 > 2) && ('a' < 'b' || true)", v).ok());  // the error surfaces
  EXPECT_FALSE(Eval("'a' < 'b'", v).ok());  // ordering needs numbers
  EXPECT_FALSE(Eval("{{params.missing}} == 1", v).ok());
  EXPECT_TRUE(*Eval("-1.5e0 < 0", v));
}

TEST(PipelineConditionTest, MalformedConditionsSayWhere) {
  for (const std::string text :
       {"", "{{params.x}} ==", "{{params.x}} = 'a'", "({{params.x}} == 1", "'open",
        "{{params.x}} == slurm", "{{params.x}} == 1 1", "{{workflow.x}} == 1", "{{params.x",
        "a & b", "1 == 2)"}) {
    auto e = ParseCondition(text);
    EXPECT_FALSE(e.ok()) << text;
  }
  auto e = ParseCondition("{{params.x}} = 'a'");
  EXPECT_NE(e.status().message().find("column 14"), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("=="), std::string::npos);
}

// Deep input is refused with a message, not a stack overflow (10,000 parentheses and
// 100,000 '!' used to crash `cohort pipeline validate` and `run`).
TEST(PipelineConditionTest, DeepOrLongConditionsAreRefused) {
  const std::string parens = std::string(10000, '(') + "true" + std::string(10000, ')');
  EXPECT_FALSE(ParseCondition(parens).ok());
  auto deep = ParseCondition(std::string(100, '(') + "true" + std::string(100, ')'));
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("levels deep"), std::string::npos)
      << deep.status().message();
  auto nots = ParseCondition(std::string(100000, '!') + "true");
  ASSERT_FALSE(nots.ok());
  std::string chain = "true";
  for (int i = 0; i < 100000; ++i) chain += " && true";
  auto long_chain = ParseCondition(chain);
  ASSERT_FALSE(long_chain.ok());
  EXPECT_NE(long_chain.status().message().find("tokens"), std::string::npos);
  // Within the bounds, nesting still works.
  auto ok = ParseCondition(std::string(60, '(') + "!!true" + std::string(60, ')'));
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
}

TEST(PipelineConditionTest, CollectsRefsAndTranslatesToArgo) {
  auto e = ParseCondition(
      "{{params.runtime}} == 'slurm' && !({{steps.prep.outputs.n}} < 10 || "
      "{{params.tag}} == 'two words')");
  ASSERT_TRUE(e.ok()) << e.status().message();
  std::vector<Ref> refs;
  CollectRefs(**e, &refs);
  ASSERT_EQ(refs.size(), 3u);
  EXPECT_EQ(refs[0].ToString(), "params.runtime");
  EXPECT_EQ(refs[1].ToString(), "steps.prep.outputs.n");
  // Text references are quoted (Argo would read a value such as us-east-1 as a subtraction),
  // except where they meet a number.
  auto is_text = [](const Ref& ref) { return ref.kind != Ref::Kind::kParam || ref.param != "n"; };
  EXPECT_EQ(ToArgoCondition(**e, is_text),
            "'{{workflow.parameters.runtime}}' == slurm && !({{tasks.prep.outputs.parameters.n}} "
            "< 10 || '{{workflow.parameters.tag}}' == 'two words')");
  auto words = ParseCondition("{{params.region}} != 'us-east-1' && {{params.n}} >= 2");
  ASSERT_TRUE(words.ok());
  EXPECT_EQ(ToArgoCondition(**words, is_text),
            "'{{workflow.parameters.region}}' != 'us-east-1' && {{workflow.parameters.n}} >= 2");
}

TEST(PipelineTemplatesTest, FindAndSubstitute) {
  auto r = SubstituteTemplates("a {{params.x}} b {{ steps.s.outputs.o }}c",
                               [](const Ref& ref) -> Result<std::string> {
                                 return std::string(ref.kind == Ref::Kind::kParam ? "X" : "O");
                               });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "a X b Oc");
  EXPECT_FALSE(FindTemplates("{{params.x").ok());
  EXPECT_FALSE(FindTemplates("{{steps.s.o}}").ok());
  EXPECT_TRUE(FindTemplates("no templates ${HOME} {x}").ok());
}

// A value is data in the field that named it: a --set value or a step's output cannot add
// fields to a job spec (before: "1\nmax_restarts: 50" pasted into the text added one).
TEST(PipelineTemplatesTest, ValuesFillYamlFieldsAndNeverAddOnes) {
  const std::string spec =
      "name: job  # a comment\n"
      "entrypoint: train\n"
      "args: [--lr, \"{{params.lr}}\", \"--out={{steps.a.outputs.dir}}/x\"]\n"
      "env: {TAG: \"{{params.tag}}\"}\n";
  auto r = SubstituteTemplatesInYaml(spec, [](const Ref& ref) -> Result<std::string> {
    if (ref.kind == Ref::Kind::kStepOutput) return std::string("/d\"]\nmax_restarts: 9 #");
    if (ref.param == "lr") return std::string("0.1\nmax_restarts: 50");
    return std::string("{a: 1}");
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  YAML::Node doc = YAML::Load(*r);
  EXPECT_FALSE(doc["max_restarts"]) << *r;
  ASSERT_EQ(doc["args"].size(), 3u) << *r;
  EXPECT_EQ(doc["args"][1].as<std::string>(), "0.1\nmax_restarts: 50");
  EXPECT_EQ(doc["args"][2].as<std::string>(), "--out=/d\"]\nmax_restarts: 9 #/x");
  EXPECT_EQ(doc["env"]["TAG"].as<std::string>(), "{a: 1}");
  EXPECT_EQ(doc["name"].as<std::string>(), "job");
  // Without templates the text is kept as written (comments too).
  EXPECT_EQ(*SubstituteTemplatesInYaml("a: 1  # c\n", nullptr), "a: 1  # c\n");
  // An unquoted template that is the whole value (YAML reads it as a mapping) is one value.
  auto five = [](const Ref&) -> Result<std::string> { return std::string("5\nx: 1"); };
  auto unquoted = SubstituteTemplatesInYaml("max_steps: {{params.n}}\nname: j\n", five);
  ASSERT_TRUE(unquoted.ok()) << unquoted.status().ToString();
  YAML::Node filled = YAML::Load(*unquoted);
  EXPECT_EQ(filled["max_steps"].as<std::string>(), "5\nx: 1");
  EXPECT_FALSE(filled["x"]);
  // An alias is its anchor's node: filled in once (a value holding "{{...}}" is not read
  // again as a template).
  auto aliased = SubstituteTemplatesInYaml("a: &x \"{{params.p}}\"\nb: *x\n",
                                           [](const Ref& r) -> Result<std::string> {
                                             return std::string(r.param == "p" ? "{{params.q}}"
                                                                               : "Q");
                                           });
  ASSERT_TRUE(aliased.ok()) << aliased.status().ToString();
  YAML::Node twice = YAML::Load(*aliased);
  EXPECT_EQ(twice["a"].as<std::string>(), "{{params.q}}");
  EXPECT_EQ(twice["b"].as<std::string>(), "{{params.q}}");
  // One in a key or a comment cannot be filled in as a value: said so, with the fix.
  auto in_comment = SubstituteTemplatesInYaml("a: 1  # {{params.n}}\n", five);
  EXPECT_EQ(in_comment.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(in_comment.status().message().find("quote"), std::string::npos)
      << in_comment.status().ToString();
}

// ---------------------------------------------------------------------------------------
// Specs

constexpr const char* kGood = R"(
name: demo
parameters:
  runtime: {type: string, default: local, enum: [local, slurm]}
  epochs: {type: int, default: 2}
  lr: {type: float, default: 0.1}
  fast: {type: bool, default: true}
  tag: plain
steps:
  - name: prep
    command: [sh, -c, "echo 5 > $COHORT_OUTPUTS/n"]
    outputs: [n, {file: data/x}]
    inputs: [prep.sh]
    cache: true
    retries: 2
    timeout: 30
  - name: train
    command: "train --epochs {{params.epochs}} --n {{steps.prep.outputs.n}}"
    depends: [prep]
    env: {LR: "{{params.lr}}"}
    when: "{{params.runtime}} == 'local' && {{steps.prep.outputs.n}} > 0"
  - name: slurm
    job: train.yaml
    backend: slurm
    depends: [prep]
    when: "{{params.runtime}} == 'slurm'"
)";

TEST(PipelineSpecTest, ParsesAGoodSpec) {
  std::vector<Problem> problems;
  PipelineSpec s = Parse(kGood, &problems);
  ASSERT_TRUE(problems.empty()) << AllProblems(problems);
  EXPECT_EQ(s.name, "demo");
  ASSERT_EQ(s.parameters.size(), 5u);
  EXPECT_EQ(s.FindParam("epochs")->type, ParamType::kInt);
  EXPECT_EQ(s.FindParam("tag")->default_value, "plain");
  ASSERT_EQ(s.steps.size(), 3u);
  EXPECT_EQ(s.steps[0].command.size(), 3u);
  EXPECT_EQ(s.steps[0].output_values, std::vector<std::string>{"n"});
  EXPECT_EQ(s.steps[0].output_files, std::vector<std::string>{"data/x"});
  EXPECT_EQ(s.steps[0].retries, 2);
  EXPECT_EQ(s.steps[0].timeout_s, 30);
  EXPECT_TRUE(s.steps[0].cache);
  EXPECT_FALSE(s.steps[1].shell.empty());
  EXPECT_TRUE(s.steps[1].condition);
  EXPECT_EQ(s.steps[2].backend, "slurm");
  auto params = ResolveParameters(s, {{"epochs", "5"}}, &problems);
  EXPECT_TRUE(problems.empty()) << AllProblems(problems);
  EXPECT_EQ(params["epochs"], "5");
  EXPECT_EQ(params["runtime"], "local");
}

TEST(PipelineSpecTest, ReportsEveryProblemWithItsLocation) {
  std::vector<Problem> problems;
  Parse(R"(
name: Bad_Name
parameters:
  runtime: {type: string, default: local}
  epochs: {type: int, default: abc}
  ratio: {type: float, default: x}
  flag: {type: bool, default: maybe}
  mode: {type: strng}
  pick: {type: int, default: 5, enum: [1, 2]}
steps:
  - name: a
    command: [echo, "{{params.epoch}}"]
    retries: -1
    timeout: soon
    cache: perhaps
  - name: b
    command: echo b
    depends: [a, nope]
    when: "{{params.runtim}} == 'slurm'"
  - name: b
    command: echo again
  - name: c
    command: "echo {{steps.a.outputs.missing}} {{steps.zzz.outputs.x}}"
    when: "{{params.runtime}} = 'x'"
    depnds: [a]
  - name: d
  - name: e
    command: echo
    job: x.yaml
  - name: f
    command: "echo {{steps.a.outputs.v}}"
)",
        &problems);
  const std::string all = AllProblems(problems);
  const std::pair<const char*, const char*> kExpected[] = {
      {"name", "lowercase"},
      {"parameters.epochs.default", "'abc' is not an int"},
      {"parameters.ratio.default", "not a float"},
      {"parameters.flag.default", "not a bool"},
      {"parameters.mode.type", "did you mean 'string'?"},
      {"parameters.pick.default", "not one of 1, 2"},
      {"steps[0].command[1]", "unknown parameter 'epoch' (did you mean 'epochs'?)"},
      {"steps[0].retries", ""},
      {"steps[0].timeout", ""},
      {"steps[0].cache", ""},
      {"steps[1].depends[1]", "unknown step 'nope'"},
      {"steps[1].when", "unknown parameter 'runtim' (did you mean 'runtime'?)"},
      {"steps[2].name", "duplicate step name 'b' (also steps[1])"},
      {"steps[3].command", "step 'a' declares no output 'missing'"},
      {"steps[3].command", "unknown step 'zzz'"},
      {"steps[3].when", "malformed condition: column 20"},
      {"steps[3].depnds", "did you mean 'depends'?"},
      {"steps[4]", "needs a 'command'"},
      {"steps[5]", "either 'command' or 'job'"},
      {"steps[6].command", "declares no output 'v'"},
  };
  for (const auto& [where, what] : kExpected) {
    EXPECT_TRUE(Has(problems, where, what)) << where << ": " << what << "\n" << all;
  }
}

TEST(PipelineSpecTest, OutputsOnlyFromDependencies) {
  std::vector<Problem> problems;
  Parse(R"(
name: p
steps:
  - name: a
    command: "echo 1 > $COHORT_OUTPUTS/v"
    outputs: [v]
  - name: b
    command: "echo {{steps.a.outputs.v}}"
)",
        &problems);
  EXPECT_TRUE(Has(problems, "steps[1].command", "'a' is not a dependency of 'b'"))
      << AllProblems(problems);
}

TEST(PipelineSpecTest, YamlSyntaxErrorHasALine) {
  std::vector<Problem> problems;
  Parse("name: x\nsteps: [\n", &problems);
  ASSERT_FALSE(problems.empty());
  EXPECT_EQ(problems[0].where.rfind("line ", 0), 0u) << problems[0].where;
}

TEST(PipelineSpecTest, ParameterOverridesAreTypeChecked) {
  std::vector<Problem> problems;
  PipelineSpec s = Parse(kGood, &problems);
  ASSERT_TRUE(problems.empty());
  ResolveParameters(s,
                    {{"epochs", "abc"}, {"lr", "fast"}, {"fast", "yes"}, {"runtime", "cloud"},
                     {"runtim", "x"}},
                    &problems);
  const std::string all = AllProblems(problems);
  EXPECT_TRUE(Has(problems, "-p epochs", "'abc' is not an int")) << all;
  EXPECT_TRUE(Has(problems, "-p lr", "not a float")) << all;
  EXPECT_TRUE(Has(problems, "-p fast", "not a bool")) << all;
  EXPECT_TRUE(Has(problems, "-p runtime", "not one of local, slurm")) << all;
  EXPECT_TRUE(Has(problems, "-p runtim", "did you mean 'runtime'?")) << all;

  problems.clear();
  PipelineSpec nodefault = Parse("name: p\nparameters: {x: {type: int}}\nsteps: [{name: a, "
                                 "command: echo}]\n", &problems);
  ResolveParameters(nodefault, {}, &problems);
  EXPECT_TRUE(Has(problems, "-p x", "required")) << AllProblems(problems);
}

TEST(PipelineSpecTest, JobStepsAreCheckedWithParameters) {
  TempDir dir;
  dir.File("good.yaml", "name: t\nentrypoint: /bin/true\nnproc_per_node: {{params.n}}\n");
  dir.File("bad.yaml", "name: t\nentrypoint: /bin/true\nnproc_per_node: many\n");
  dir.File("neuron.yaml", "name: t\nentrypoint: /bin/true\n"
                          "resources: {extended: {aws.amazon.com/neuron: 1}}\n"
                          "placement: {node_selector: {zone: a}}\n");
  std::vector<Problem> problems;
  PipelineSpec s = Parse(R"(
name: p
parameters: {n: {type: int, default: 2}}
steps:
  - {name: a, job: good.yaml}
  - {name: b, job: bad.yaml}
  - {name: c, job: missing.yaml}
  - {name: d, job: neuron.yaml}
  - {name: e, job: neuron.yaml, backend: slurm}
  - {name: f, job: neuron.yaml, backend: kubernetes}
)",
                         &problems, dir.path());
  ASSERT_TRUE(problems.empty()) << AllProblems(problems);
  CheckJobSteps(s, {{"n", "2"}}, &problems);
  const std::string all = AllProblems(problems);
  EXPECT_FALSE(Has(problems, "steps[0].job", "")) << all;
  EXPECT_TRUE(Has(problems, "steps[1].job", "nproc_per_node")) << all;
  EXPECT_TRUE(Has(problems, "steps[2].job", "cannot read")) << all;
  // What the step's backend can never honour is refused before anything runs.
  EXPECT_TRUE(Has(problems, "steps[3].job", "the local backend cannot reserve aws.amazon.com/neuron"))
      << all;
  EXPECT_TRUE(Has(problems, "steps[4].job", "placement.node_selector")) << all;
  EXPECT_FALSE(Has(problems, "steps[4].job", "resources.extended")) << all;
  EXPECT_FALSE(Has(problems, "steps[5].job", "")) << all;
}

// ---------------------------------------------------------------------------------------
// Order

TEST(PipelineOrderTest, TopologicalAndStable) {
  std::vector<Problem> problems;
  PipelineSpec s = Parse(R"(
name: p
steps:
  - {name: d, command: echo, depends: [b, c]}
  - {name: b, command: echo, depends: [a]}
  - {name: c, command: echo, depends: [a]}
  - {name: a, command: echo}
  - {name: e, command: echo}
)",
                         &problems);
  ASSERT_TRUE(problems.empty()) << AllProblems(problems);
  auto order = TopologicalOrder(s, &problems);
  std::vector<std::string> names;
  for (size_t i : order) names.push_back(s.steps[i].name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_TRUE(DependsOn(s, "d", "a"));
  EXPECT_FALSE(DependsOn(s, "a", "d"));
  EXPECT_FALSE(DependsOn(s, "e", "a"));
}

TEST(PipelineOrderTest, CyclesAreNamed) {
  std::vector<Problem> problems;
  Parse(R"(
name: p
steps:
  - {name: a, command: echo, depends: [c]}
  - {name: b, command: echo, depends: [a]}
  - {name: c, command: echo, depends: [b]}
  - {name: d, command: echo}
  - {name: self, command: echo, depends: [self]}
)",
        &problems);
  const std::string all = AllProblems(problems);
  EXPECT_NE(all.find("dependency cycle: "), std::string::npos) << all;
  EXPECT_NE(all.find("a -> c -> b -> a"), std::string::npos) << all;
  EXPECT_TRUE(Has(problems, "steps[4].depends[0]", "cannot depend on itself")) << all;
}

// ---------------------------------------------------------------------------------------
// Resolution and cache keys

TEST(PipelineCacheTest, KeyFollowsCommandInputsAndParameters) {
  TempDir dir;
  dir.File("in.txt", "one");
  std::vector<Problem> problems;
  PipelineSpec s = Parse(R"(
name: p
parameters: {n: {type: int, default: 1}}
steps:
  - name: a
    command: "echo {{params.n}}"
    inputs: [in.txt]
    cache: true
)",
                         &problems, dir.path());
  ASSERT_TRUE(problems.empty()) << AllProblems(problems);
  auto key = [&](const std::map<std::string, std::string>& params) {
    auto r = ResolveStep(s.steps[0], dir.path(), params, {});
    EXPECT_TRUE(r.ok());
    auto k = CacheKey("a", *r);
    EXPECT_TRUE(k.ok()) << k.status().message();
    return k.value_or("");
  };
  std::string k1 = key({{"n", "1"}});
  EXPECT_EQ(k1.size(), 32u);
  EXPECT_EQ(key({{"n", "1"}}), k1);           // deterministic
  EXPECT_NE(key({{"n", "2"}}), k1);           // parameter in the command
  dir.File("in.txt", "two");
  std::string k3 = key({{"n", "1"}});
  EXPECT_NE(k3, k1);                          // input contents
  dir.File("in.txt", "one");
  EXPECT_EQ(key({{"n", "1"}}), k1);           // back to the same contents
  fs::remove(dir.path() + "/in.txt");
  auto r = ResolveStep(s.steps[0], dir.path(), {{"n", "1"}}, {});
  EXPECT_FALSE(CacheKey("a", *r).ok());       // a missing input is an error
}

TEST(PipelineResolveTest, SubstitutesParamsAndOutputs) {
  std::vector<Problem> problems;
  PipelineSpec s = Parse(kGood, &problems, "/base");
  ASSERT_TRUE(problems.empty());
  auto r = ResolveStep(s.steps[1], "/base", {{"epochs", "7"}, {"lr", "0.5"}},
                       {{"prep", {{"n", "9"}}}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->argv, (std::vector<std::string>{"/bin/sh", "-c", "train --epochs 7 --n 9"}));
  EXPECT_EQ(r->env.at("LR"), "0.5");
  EXPECT_EQ(r->workdir, "/base");
  EXPECT_FALSE(ResolveStep(s.steps[1], "/base", {{"epochs", "7"}, {"lr", "0.5"}}, {}).ok());
}

// ---------------------------------------------------------------------------------------
// Executor on real processes

struct Harness {
  TempDir dir{"cohort-pipeline-test-"};
  std::vector<std::string> lines;

  Result<RunOutcome> Run(const std::string& yaml, std::map<std::string, std::string> overrides = {},
                         int parallel = 2) {
    std::vector<Problem> problems;
    dir.File("p.yaml", yaml);
    PipelineSpec spec = ParsePipelineSpec(yaml, dir.path(), &problems);
    auto params = ResolveParameters(spec, overrides, &problems);
    if (!problems.empty()) return InvalidArgument("{}", AllProblems(problems));
    return ExecuteNew(spec, dir.path() + "/p.yaml", yaml, params, Options(parallel));
  }
  ExecutorOptions Options(int parallel = 2) {
    ExecutorOptions o;
    o.home = dir.path() + "/home";
    o.parallel = parallel;
    o.kill_grace_s = 1;
    o.progress = [this](const std::string& l) { lines.push_back(l); };
    return o;
  }
  std::map<std::string, StepRecord> Steps(int64_t run) {
    auto db = RunDb::Open(RunDbPath(dir.path() + "/home"));
    std::map<std::string, StepRecord> out;
    auto steps = (*db)->Steps(run);
    for (const auto& s : *steps) out[s.name] = s;
    return out;
  }
  bool Printed(const std::string& line) const {
    return std::find(lines.begin(), lines.end(), line) != lines.end();
  }
};

TEST(PipelineExecutorTest, ParallelStepsOverlapAndOutputsFlow) {
  Harness h;
  // Each of a and b waits (bounded) for the other's marker: both succeed only if they run
  // at the same time.
  auto out = h.Run(R"(
name: p
steps:
  - name: a
    command: "touch a.mark; i=0; while [ ! -e b.mark ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; [ -e b.mark ] && echo 21 > $COHORT_OUTPUTS/x"
    outputs: [x]
  - name: b
    command: "touch b.mark; i=0; while [ ! -e a.mark ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; [ -e a.mark ]"
  - name: c
    command: "echo $(( {{steps.a.outputs.x}} * 2 )) > $COHORT_OUTPUTS/y"
    depends: [a, b]
    outputs: [y]
)");
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(StateName(out->state), "succeeded");
  auto steps = h.Steps(out->run_id);
  EXPECT_EQ(steps["c"].outputs["y"], "42");
  EXPECT_TRUE(h.Printed("[a] running"));
}

TEST(PipelineExecutorTest, RetriesTimeoutsAndFailurePropagation) {
  Harness h;
  auto out = h.Run(R"(
name: p
steps:
  - name: flaky
    command: "n=$(cat count 2>/dev/null || echo 0); echo $((n+1)) > count; [ $n -ge 2 ]"
    retries: 3
  - name: slow
    command: "sleep 30"
    timeout: 0.5
  - name: after-slow
    command: "echo never"
    depends: [slow]
  - name: independent
    command: "echo fine"
)");
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(StateName(out->state), "failed");
  auto steps = h.Steps(out->run_id);
  EXPECT_EQ(StateName(steps["flaky"].state), "succeeded");
  EXPECT_EQ(steps["flaky"].attempts, 3);
  EXPECT_EQ(StateName(steps["slow"].state), "failed");
  EXPECT_NE(steps["slow"].detail.find("timed out"), std::string::npos);
  EXPECT_EQ(StateName(steps["after-slow"].state), "not-run");
  EXPECT_EQ(StateName(steps["independent"].state), "succeeded");
  EXPECT_TRUE(h.Printed("[flaky] failed: exit code 1 (retry 1/3)"));
}

TEST(PipelineExecutorTest, ConditionsCacheAndResume) {
  Harness h;
  h.dir.File("in.txt", "v1");
  const std::string yaml = R"(
name: p
parameters: {runtime: {type: string, default: local}}
steps:
  - name: cached
    command: "cat in.txt >> ran.log; echo done > $COHORT_OUTPUTS/v"
    inputs: [in.txt]
    outputs: [v]
    cache: true
  - name: only-slurm
    command: "echo slurm"
    when: "{{params.runtime}} == 'slurm'"
  - name: gate
    command: "[ -e ok ]"
    depends: [cached]
  - name: last
    command: "echo {{steps.cached.outputs.v}} > last.txt"
    depends: [gate, only-slurm]
)";
  auto first = h.Run(yaml);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(StateName(first->state), "failed");
  auto s1 = h.Steps(first->run_id);
  EXPECT_EQ(StateName(s1["only-slurm"].state), "skipped");
  EXPECT_EQ(StateName(s1["gate"].state), "failed");
  EXPECT_EQ(StateName(s1["last"].state), "not-run");

  // Resume after fixing the cause: only gate and last run.
  h.dir.File("ok", "");
  auto resumed = Resume(first->run_id, h.Options());
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ(StateName(resumed->state), "succeeded");
  EXPECT_EQ(h.dir.Read("ran.log"), "v1");
  EXPECT_EQ(h.dir.Read("last.txt"), "done\n");

  // A new run reuses the cached step; a changed input runs it again.
  auto second = h.Run(yaml);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(StateName(h.Steps(second->run_id)["cached"].state), "cached");
  EXPECT_EQ(h.dir.Read("ran.log"), "v1");
  h.dir.File("in.txt", "v2");
  auto third = h.Run(yaml);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(StateName(h.Steps(third->run_id)["cached"].state), "succeeded");
  EXPECT_EQ(h.dir.Read("ran.log"), "v1v2");
}

// ---------------------------------------------------------------------------------------
// Argo export

TEST(PipelineArgoTest, WorkflowStructure) {
  std::vector<Problem> problems;
  PipelineSpec s = Parse(kGood, &problems);
  ASSERT_TRUE(problems.empty());
  auto params = ResolveParameters(s, {{"epochs", "4"}}, &problems);
  nlohmann::json wf = ExportArgo(s, params, {"img:1", ""});
  EXPECT_EQ(wf["apiVersion"], "argoproj.io/v1alpha1");
  EXPECT_EQ(wf["kind"], "Workflow");
  const auto& spec = wf["spec"];
  EXPECT_EQ(spec["entrypoint"], "cohort-dag");
  bool found_epochs = false;
  for (const auto& p : spec["arguments"]["parameters"]) {
    if (p["name"] == "epochs") {
      found_epochs = true;
      EXPECT_EQ(p["value"], "4");
    }
    if (p["name"] == "runtime") {
      EXPECT_EQ(p["enum"].size(), 2u);
    }
  }
  EXPECT_TRUE(found_epochs);
  const auto& tasks = spec["templates"][0]["dag"]["tasks"];
  ASSERT_EQ(tasks.size(), 3u);
  EXPECT_EQ(tasks[1]["dependencies"][0], "prep");
  EXPECT_EQ(tasks[1]["when"],
            "'{{workflow.parameters.runtime}}' == local && "
            "{{tasks.prep.outputs.parameters.n}} > 0");
  EXPECT_EQ(tasks[2]["when"], "'{{workflow.parameters.runtime}}' == slurm");
  EXPECT_EQ(tasks[1]["arguments"]["parameters"][0]["value"],
            "{{tasks.prep.outputs.parameters.n}}");
  const auto& prep = spec["templates"][1];
  EXPECT_EQ(prep["name"], "prep");
  EXPECT_EQ(prep["container"]["image"], "img:1");
  EXPECT_EQ(prep["retryStrategy"]["limit"], 2);
  EXPECT_EQ(prep["activeDeadlineSeconds"], 30);
  EXPECT_EQ(prep["outputs"]["parameters"][0]["valueFrom"]["path"], "/tmp/outputs/n");
  const auto& train = spec["templates"][2];
  EXPECT_EQ(train["container"]["command"][2],
            "train --epochs {{workflow.parameters.epochs}} --n {{inputs.parameters.prep-n}}");
  EXPECT_EQ(train["inputs"]["parameters"][0]["name"], "prep-n");
  const auto& job = spec["templates"][3];
  EXPECT_EQ(job["container"]["command"][0], "cohort");
  // Strings that read as numbers stay strings in the YAML.
  std::string yaml = *launch::JsonToYaml(wf);
  EXPECT_NE(yaml.find("value: \"4\""), std::string::npos) << yaml;
}

TEST(PipelineArgoTest, ValidatesAgainstTheArgoSchema) {
  const std::string npm = std::string(COHORT_SOURCE_DIR) + "/tests/k8s";
  if (!FindProgram("node").ok() ||
      !fs::exists(npm + "/node_modules/@kubernetes-models/argo-workflows")) {
    GTEST_SKIP() << "needs node and tests/k8s/node_modules (tools/install-npm-deps.sh)";
  }
  TempDir dir;
  std::vector<Problem> problems;
  PipelineSpec s = Parse(kGood, &problems);
  auto params = ResolveParameters(s, {}, &problems);
  std::string good = dir.File("wf.yaml", *launch::JsonToYaml(ExportArgo(s, params, {})));
  std::string cmd = fmt::format("cd {} && node validate-argo.mjs {} > {}/out.txt 2>&1", npm, good,
                                dir.path());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << dir.Read("out.txt");
  // The validator does reject a broken workflow.
  nlohmann::json broken = ExportArgo(s, params, {});
  broken["spec"]["templates"][1]["retryStrategy"]["limit"] = nlohmann::json::array();
  broken["spec"]["templates"][1]["container"].erase("name");
  std::string bad = dir.File("bad.yaml", *launch::JsonToYaml(broken));
  cmd = fmt::format("cd {} && node validate-argo.mjs {} > {}/out.txt 2>&1", npm, bad, dir.path());
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(dir.Read("out.txt").find("name"), std::string::npos) << dir.Read("out.txt");
}

}  // namespace
}  // namespace cohort::pipeline
