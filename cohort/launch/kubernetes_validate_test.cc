// Tests of the kubernetes backend's checks without a cluster: the manifests of every flavor
// and case are read back by a YAML 1.2 reader (js-yaml), compared with the objects they came
// from, and validated offline: Kubeflow's and Volcano's CRDs with
// ../shared/k8s/crdvalidate.mjs, core objects with tests/k8s/validate-core.mjs (Kubernetes'
// OpenAPI schemas from the kubernetes-models npm package, unknown fields included); the
// validators' own rejections; and Validate's problems (image, names, queue, priority,
// volumes, arrays, fields a flavor cannot honour).
//
// Needs node and tests/k8s/node_modules (tools/install-npm-deps.sh); the CRD checks are
// skipped when ../shared/k8s is absent.
#include "cohort/launch/kubernetes_backend.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <utility>

#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/temp_dir.h"
#include "cohort/launch/kubernetes_test_util.h"

namespace cohort::launch::kubernetes_test {
namespace {

namespace fs = std::filesystem;

const std::string kSourceDir = COHORT_SOURCE_DIR;
const std::string kNpmDir = kSourceDir + "/tests/k8s";
const std::string kSharedDir = kSourceDir + "/../shared/k8s";

bool HaveNode() { return FindProgram("node").ok(); }
bool HaveNodeModules() { return fs::exists(kNpmDir + "/node_modules/kubernetes-models"); }
bool HaveShared() { return fs::exists(kSharedDir + "/crdvalidate.mjs"); }

// ---------------------------------------------------------------------------------------
// Offline validation of every flavor x case

class RenderValidation : public ::testing::TestWithParam<std::string> {};

TEST_P(RenderValidation, EveryCaseIsValidForItsSchemas) {
  const std::string flavor = GetParam();
  ASSERT_TRUE(HaveNode()) << "node is required (tools/install-deps.sh installs it)";
  ASSERT_TRUE(HaveNodeModules()) << "run tools/install-npm-deps.sh (installs " << kNpmDir
                                 << "/node_modules)";
  TempDir dir;
  for (const Case& c : AllCases(flavor)) {
    SCOPED_TRACE(flavor + "/" + c.label);
    auto objects = RenderKubernetesObjects(c.spec, c.elements, flavor, "cohort");
    ASSERT_TRUE(objects.ok()) << objects.status().ToString();
    auto yaml = KubernetesYaml(*objects);
    ASSERT_TRUE(yaml.ok()) << yaml.status().ToString();
    const std::string all = dir.File(c.label + ".yaml", *yaml);

    // A YAML 1.2 reader reads back the very objects.
    auto read = RunShell(fmt::format("node {} {}", Quote(kNpmDir + "/to-json.mjs"), Quote(all)));
    ASSERT_EQ(read.exit_code, 0) << read.output;
    nlohmann::json parsed = nlohmann::json::parse(read.output);
    ASSERT_EQ(parsed.size(), objects->size());
    for (size_t i = 0; i < objects->size(); ++i) {
      EXPECT_EQ(parsed[i], nlohmann::json::parse((*objects)[i].dump())) << "document " << i;
    }

    // Split by schema: Kubeflow / Volcano CRDs, or core Kubernetes objects.
    std::string pytorch, volcano, core;
    // Documents are separated by "---" lines; route each by its apiVersion line.
    std::string current;
    auto flush = [&] {
      if (current.empty()) return;
      if (Contains(current, "\napiVersion: kubeflow.org/v1\n")) {
        pytorch += current;
      } else if (Contains(current, "\napiVersion: batch.volcano.sh/v1alpha1\n")) {
        volcano += current;
      } else {
        core += current;
      }
      current.clear();
    };
    for (const auto& line : Split(*yaml, '\n', false)) {
      if (line == "---") flush();
      current += line + "\n";
    }
    flush();
    if (!core.empty()) {
      auto r = RunShell(fmt::format("node {} {}", Quote(kNpmDir + "/validate-core.mjs"),
                                    Quote(dir.File(c.label + "-core.yaml", core))));
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
    if (!HaveShared()) continue;
    for (const auto& [docs, crd] : {std::pair{pytorch, "kubeflow.org_pytorchjobs.yaml"},
                                    std::pair{volcano, "batch.volcano.sh_jobs.yaml"}}) {
      if (docs.empty()) continue;
      auto r = RunShell(
          fmt::format("node --import {} {} {} {}", Quote(kNpmDir + "/resolve-here.mjs"),
                      Quote(kSharedDir + "/crdvalidate.mjs"), Quote(kSharedDir + "/" + crd),
                      Quote(dir.File(c.label + "-" + crd, docs))));
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
  }
  if (!HaveShared()) GTEST_SKIP() << kSharedDir << " is absent: CRD validation skipped";
}

INSTANTIATE_TEST_SUITE_P(Flavors, RenderValidation,
                         ::testing::Values("pytorchjob", "volcano", "indexed"));

// The validators themselves reject what the API server would.
TEST(ValidatorsTest, RejectUnknownFieldsAndBadTypes) {
  ASSERT_TRUE(HaveNode() && HaveNodeModules()) << "run tools/install-npm-deps.sh";
  TempDir dir;
  auto core = RunShell(
      fmt::format("node {} {}", Quote(kNpmDir + "/validate-core.mjs"),
                  Quote(dir.File("bad-core.yaml",
                                 "apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\nspec:\n"
                                 "  completions: two\n  template:\n    spec:\n      containers:\n"
                                 "      - {name: w, image: i, imag: typo}\n"))));
  EXPECT_EQ(core.exit_code, 1) << core.output;
  EXPECT_TRUE(Contains(core.output, "/spec/completions must be integer")) << core.output;
  EXPECT_TRUE(Contains(core.output, "unknown field \"imag\"")) << core.output;
  if (!HaveShared()) GTEST_SKIP() << kSharedDir << " is absent";
  auto crd = RunShell(fmt::format(
      "node --import {} {} {} {}", Quote(kNpmDir + "/resolve-here.mjs"),
      Quote(kSharedDir + "/crdvalidate.mjs"), Quote(kSharedDir + "/batch.volcano.sh_jobs.yaml"),
      Quote(dir.File("bad-volcano.yaml",
                     "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: x}\n"
                     "spec: {minAvailable: 1, gang: true}\n"))));
  EXPECT_EQ(crd.exit_code, 1) << crd.output;
  EXPECT_TRUE(Contains(crd.output, "gang")) << crd.output;
}

// ---------------------------------------------------------------------------------------
// Validate

std::vector<Problem> ProblemsOf(const JobSpec& spec, const std::vector<ArrayElement>& elements = {},
                                const std::string& flavor = "pytorchjob") {
  BackendOptions options;
  options.kube_flavor = flavor;
  auto backend = MakeKubernetesBackend(options);
  std::vector<Problem> problems;
  backend->Validate(spec, elements, &problems);
  return problems;
}

bool HasProblem(const std::vector<Problem>& problems, const std::string& where,
                const std::string& what) {
  for (const auto& p : problems) {
    if (p.where == where && Contains(p.what, what)) return true;
  }
  return false;
}

TEST(KubernetesValidateTest, ImageIsRequired) {
  JobSpec spec = SingleNodeSpec();
  spec.image.clear();
  auto problems = ProblemsOf(spec);
  ASSERT_EQ(problems.size(), 1u) << FormatProblems(problems);
  EXPECT_EQ(problems[0].where, "image");
  EXPECT_EQ(problems[0].what,
            "required by the kubernetes backend (the container image with cohort and your "
            "program)");
  // Render refuses the same spec with the problem in its message.
  auto rendered = RenderKubernetes(spec, {}, "pytorchjob", "cohort");
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(rendered.status().message(), "image: required by the kubernetes backend"));
}

TEST(KubernetesValidateTest, ValidSpecsHaveNoProblems) {
  for (const std::string flavor : {"pytorchjob", "volcano", "indexed"}) {
    for (const Case& c : AllCases(flavor)) {
      EXPECT_TRUE(ProblemsOf(c.spec, c.elements, flavor).empty())
          << c.label << "/" << flavor << ": "
          << FormatProblems(ProblemsOf(c.spec, c.elements, flavor));
    }
  }
}

TEST(KubernetesValidateTest, NamesAndKubernetesRules) {
  JobSpec spec = ElasticSpec();
  spec.name = "9lives";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "name", "must start with a letter"));
  spec.name = "bad-";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "name", "is not a DNS-1123 label"));
  spec.name = std::string(56, 'a');  // + "-worker-3" is 65 characters
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "name", "shorten the name by 2 characters"));
  EXPECT_TRUE(ProblemsOf(spec, {}, "indexed").empty());  // "<name>-3" fits

  spec = ElasticSpec();
  spec.priority = "10";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "priority", "name of a PriorityClass"));
  spec.priority = "high";
  spec.queue = "Research_Q";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "queue", "DNS-1123 label"));
  spec.queue = "research";
  spec.volumes[0].name = "cohort-shm";
  spec.mounts[0].volume = "cohort-shm";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "volumes[0].name", "reserved"));
  spec.volumes[0].name = "Data";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "volumes[0].name", "DNS-1123 label"));

  EXPECT_TRUE(HasProblem(ProblemsOf(SingleNodeSpec(), {}, "kubeflow"), "kubernetes flavor",
                         "not one of pytorchjob, volcano, indexed"));
}

TEST(KubernetesValidateTest, Arrays) {
  // Multi-node arrays run every element at once: a cap cannot be honoured.
  JobSpec spec = MultiNodeArraySpec();
  spec.array.concurrency = 1;
  EXPECT_TRUE(HasProblem(ProblemsOf(spec, Elements(3)), "array.concurrency",
                         "Kubernetes cannot cap how many run"));
  spec.array.concurrency = 3;
  EXPECT_TRUE(ProblemsOf(spec, Elements(3)).empty());
  // Single-node arrays export their variables in a shell.
  auto elements = Elements(2);
  elements[1].env["my-column"] = "x";
  EXPECT_TRUE(HasProblem(ProblemsOf(SingleNodeArraySpec(), elements), "array",
                         "'my-column' (a column or variable of the elements) is not an "
                         "environment variable name"));
  // More than a ConfigMap holds.
  auto big = Elements(3);
  for (auto& e : big) e.env["BLOB"] = std::string(400000, 'x');
  EXPECT_TRUE(HasProblem(ProblemsOf(SingleNodeArraySpec(), big), "array", "ConfigMap"));
}

TEST(KubernetesValidateTest, FieldsAFlavorCannotHonourAreProblems) {
  EXPECT_TRUE(HasProblem(ProblemsOf(MasterSpec(), {}, "volcano"), "kubernetes.master",
                         "only the pytorchjob flavor"));
  EXPECT_TRUE(HasProblem(ProblemsOf(MasterSpec(), {}, "indexed"), "kubernetes.clean_pod_policy",
                         "only the pytorchjob flavor"));
  JobSpec elastic = MasterSpec();
  elastic.min_nodes = 1;
  EXPECT_TRUE(HasProblem(ProblemsOf(elastic, {}, "pytorchjob"), "kubernetes.master", "fixed size"));
  JobSpec any_port = AcceleratorSpec();
  any_port.metrics.port = 0;
  EXPECT_TRUE(HasProblem(ProblemsOf(any_port, {}, "indexed"), "metrics.port", "fixed port"));
}

}  // namespace
}  // namespace cohort::launch::kubernetes_test
