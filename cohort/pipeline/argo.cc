// Argo Workflow export (see argo.h). Thread-safety: pure functions.
#include "cohort/pipeline/argo.h"

#include <filesystem>
#include <optional>
#include <set>

#include "cohort/base/file.h"
#include "cohort/launch/job_env.h"

namespace cohort::pipeline {
namespace {

using json = nlohmann::json;

// The name of the input parameter carrying `ref` (an output of another step) into a template.
std::string InputName(const Ref& ref) { return ref.step + "-" + ref.output; }

// Rewrites the templates of `text` for use inside a container template; collects the
// step outputs it needs as inputs.
std::string ForTemplate(const std::string& text, std::set<std::pair<std::string, std::string>>*
                                                     needed) {
  auto rewritten = SubstituteTemplates(text, [&](const Ref& ref) -> Result<std::string> {
    if (ref.kind == Ref::Kind::kParam) return "{{workflow.parameters." + ref.param + "}}";
    needed->insert({ref.step, ref.output});
    return "{{inputs.parameters." + InputName(ref) + "}}";
  });
  return rewritten.ok() ? *rewritten : text;  // validated specs always rewrite
}

constexpr const char* kOutputsDir = "/tmp/outputs";
constexpr const char* kOutputsVolume = "cohort-outputs";
constexpr const char* kWorkspaceVolume = "cohort-workspace";

// The workspace of the export: the spec's, with the options' claim and path over it.
std::optional<Workspace> ExportWorkspace(const PipelineSpec& spec, const ArgoOptions& o) {
  std::optional<Workspace> w = spec.workspace;
  if (!o.workspace_claim.empty()) {
    if (!w) w = Workspace{};
    w->claim = o.workspace_claim;
  }
  if (w && !o.workspace_path.empty()) w->path = o.workspace_path;
  return w;
}

// The templates a job step's spec file uses (read from the pipeline's directory when its
// path has no template of its own); nullopt when it cannot be read.
std::optional<std::vector<Ref>> JobSpecRefs(const PipelineSpec& spec, const Step& s) {
  if (s.job.find("{{") != std::string::npos) return std::nullopt;
  std::filesystem::path p(s.job);
  if (p.is_relative()) p = std::filesystem::path(spec.base_dir) / p;
  auto text = ReadFileToString(p.string());
  if (!text.ok()) return std::nullopt;
  auto uses = FindTemplates(*text);
  std::vector<Ref> refs;
  if (uses.ok()) {
    for (const auto& u : *uses) refs.push_back(u.ref);
  }
  return refs;
}

// `cohort submit --wait [--backend B]` of a job step, its templates carried in by --set: the
// pipeline parameters and the step outputs its spec reads (outputs as input parameters of
// the template). A spec that cannot be read here (its path a template) gets every
// parameter, and --set-unused-ok (submit refuses a --set that fills nothing otherwise).
json JobCommand(const PipelineSpec& spec, const Step& s,
                std::set<std::pair<std::string, std::string>>* needed) {
  json argv = {"cohort", "submit", "--wait"};
  // The default backend is cohort submit's too; left out, a spec that names targets sends
  // its elements to them, as `cohort pipeline run` does (an explicit --backend is refused).
  if (s.backend != "local") {
    argv.push_back("--backend");
    argv.push_back(s.backend);
  }
  const std::optional<std::vector<Ref>> refs = JobSpecRefs(spec, s);
  const std::vector<Ref> spec_refs = refs.value_or(std::vector<Ref>{});
  std::set<std::string> used;
  for (const Ref& ref : spec_refs) {
    if (ref.kind == Ref::Kind::kParam) used.insert(ref.param);
  }
  if (!refs) argv.push_back("--set-unused-ok");
  for (const auto& p : spec.parameters) {
    if (refs && !used.count(p.name)) continue;
    argv.push_back("--set");
    argv.push_back(p.name + "={{workflow.parameters." + p.name + "}}");
  }
  std::set<std::string> seen;
  for (const Ref& ref : spec_refs) {
    if (ref.kind != Ref::Kind::kStepOutput || !seen.insert(ref.ToString()).second) continue;
    argv.push_back("--set");
    argv.push_back(ref.ToString() + "=" + ForTemplate("{{" + ref.ToString() + "}}", needed));
  }
  argv.push_back(ForTemplate(s.job, needed));
  return argv;
}

}  // namespace

std::string ArgoServiceAccount(const PipelineSpec& spec, const ArgoOptions& options) {
  if (!options.service_account.empty()) return options.service_account;
  return options.rbac ? spec.name + "-cohort" : "";
}

std::vector<std::string> StepsSubmittingToKubernetes(const PipelineSpec& spec) {
  std::vector<std::string> out;
  for (const auto& s : spec.steps) {
    if (!s.job.empty() && (s.backend == "kubernetes" || s.backend == "k8s")) out.push_back(s.name);
  }
  return out;
}

std::vector<json> ArgoRbacObjects(const PipelineSpec& spec, const ArgoOptions& options) {
  if (!options.rbac) return {};
  const std::string name = ArgoServiceAccount(spec, options);
  const json labels = {{"cohort.dev/pipeline", spec.name}};
  auto rule = [](std::vector<std::string> groups, std::vector<std::string> resources,
                 std::vector<std::string> verbs) {
    return json{{"apiGroups", groups}, {"resources", resources}, {"verbs", verbs}};
  };
  const std::vector<std::string> manage = {"get", "list", "watch", "create", "update", "patch",
                                           "delete"};
  // What `cohort submit | status | logs | cancel --backend kubernetes` touches: the job
  // objects of every flavor, their Services, ConfigMaps (array elements), Secrets (the
  // store token), the etcd Deployment; pods and their logs to read. Argo's executor
  // reports a step's outputs as workflowtaskresults.
  json rules = json::array({
      rule({"kubeflow.org"}, {"pytorchjobs"}, manage),
      rule({"batch.volcano.sh"}, {"jobs"}, manage),
      rule({"batch"}, {"jobs"}, manage),
      rule({""}, {"services", "configmaps", "secrets"}, manage),
      rule({"apps"}, {"deployments"}, manage),
      rule({""}, {"pods", "pods/log"}, {"get", "list", "watch"}),
      rule({"argoproj.io"}, {"workflowtaskresults"}, {"create", "patch"}),
  });
  return {
      json{{"apiVersion", "v1"},
           {"kind", "ServiceAccount"},
           {"metadata", {{"name", name}, {"labels", labels}}}},
      json{{"apiVersion", "rbac.authorization.k8s.io/v1"},
           {"kind", "Role"},
           {"metadata", {{"name", name}, {"labels", labels}}},
           {"rules", rules}},
      json{{"apiVersion", "rbac.authorization.k8s.io/v1"},
           {"kind", "RoleBinding"},
           {"metadata", {{"name", name}, {"labels", labels}}},
           {"roleRef",
            {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "Role"}, {"name", name}}},
           {"subjects", json::array({{{"kind", "ServiceAccount"}, {"name", name}}})}},
  };
}

json ExportArgo(const PipelineSpec& spec, const std::map<std::string, std::string>& params,
                const ArgoOptions& options) {
  json wf;
  wf["apiVersion"] = "argoproj.io/v1alpha1";
  wf["kind"] = "Workflow";
  wf["metadata"] = {{"generateName", spec.name + "-"},
                    {"labels", {{"cohort.dev/pipeline", spec.name}}}};
  json parameters = json::array();
  for (const auto& p : spec.parameters) {
    json jp = {{"name", p.name}};
    auto it = params.find(p.name);
    if (it != params.end()) jp["value"] = it->second;
    if (!p.enum_values.empty()) jp["enum"] = p.enum_values;
    jp["description"] = std::string("type ") + ParamTypeName(p.type);
    parameters.push_back(jp);
  }
  json tasks = json::array();
  json templates = json::array();
  const std::optional<Workspace> workspace = ExportWorkspace(spec, options);
  for (const auto& s : spec.steps) {
    std::set<std::pair<std::string, std::string>> needed;
    json container = {{"name", "main"}, {"image", options.image}};
    if (!s.command.empty()) {
      json argv = json::array();
      for (const auto& a : s.command) argv.push_back(ForTemplate(a, &needed));
      container["command"] = argv;
    } else if (!s.shell.empty()) {
      container["command"] = {"sh", "-c", ForTemplate(s.shell, &needed)};
    } else {
      container["command"] = JobCommand(spec, s, &needed);
    }
    if (!s.workdir.empty()) container["workingDir"] = ForTemplate(s.workdir, &needed);
    json env = json::array();
    env.push_back({{"name", launch::kEnvOutputs}, {"value", kOutputsDir}});
    env.push_back({{"name", launch::kEnvPipeline}, {"value", spec.name}});
    env.push_back({{"name", launch::kEnvPipelineStep}, {"value", s.name}});
    if (workspace) env.push_back({{"name", launch::kEnvWorkspace}, {"value", workspace->path}});
    for (const auto& [k, v] : s.env) env.push_back({{"name", k}, {"value", ForTemplate(v, &needed)}});
    container["env"] = env;
    // Each pod gets its own empty outputs directory (a stock image has none), and the
    // workspace every step shares.
    container["volumeMounts"] = {{{"name", kOutputsVolume}, {"mountPath", kOutputsDir}}};
    if (workspace) {
      container["volumeMounts"].push_back(
          {{"name", kWorkspaceVolume}, {"mountPath", workspace->path}});
    }
    json tmpl = {{"name", s.name}, {"container", container}};
    if (!s.output_values.empty()) {
      json outs = json::array();
      for (const auto& o : s.output_values) {
        outs.push_back({{"name", o}, {"valueFrom", {{"path", std::string(kOutputsDir) + "/" + o}}}});
      }
      tmpl["outputs"] = {{"parameters", outs}};
    }
    if (s.retries > 0) tmpl["retryStrategy"] = {{"limit", s.retries}};
    if (s.timeout_s > 0) {
      tmpl["activeDeadlineSeconds"] = static_cast<int64_t>(s.timeout_s + 0.999);
    }
    json task = {{"name", s.name}, {"template", s.name}};
    if (!s.depends.empty()) task["dependencies"] = s.depends;
    if (s.condition) {
      // Parameters keep their declared type; step outputs are text.
      task["when"] = ToArgoCondition(*s.condition, [&](const Ref& ref) {
        const Parameter* p = ref.kind == Ref::Kind::kParam ? spec.FindParam(ref.param) : nullptr;
        return p == nullptr || p->type == ParamType::kString;
      });
    }
    if (!needed.empty()) {
      json inputs = json::array(), args = json::array();
      for (const auto& [step, output] : needed) {
        Ref r;
        r.kind = Ref::Kind::kStepOutput;
        r.step = step;
        r.output = output;
        inputs.push_back({{"name", InputName(r)}});
        args.push_back({{"name", InputName(r)},
                        {"value", "{{tasks." + step + ".outputs.parameters." + output + "}}"}});
      }
      tmpl["inputs"] = {{"parameters", inputs}};
      task["arguments"] = {{"parameters", args}};
    }
    tasks.push_back(task);
    templates.push_back(tmpl);
  }
  templates.insert(templates.begin(), json{{"name", "cohort-dag"}, {"dag", {{"tasks", tasks}}}});
  json wspec = {{"entrypoint", "cohort-dag"}, {"templates", templates}};
  wspec["volumes"] = {{{"name", kOutputsVolume}, {"emptyDir", json::object()}}};
  if (workspace) {
    std::set<std::pair<std::string, std::string>> none;  // a claim names parameters only
    wspec["volumes"].push_back(
        {{"name", kWorkspaceVolume},
         {"persistentVolumeClaim", {{"claimName", ForTemplate(workspace->claim, &none)}}}});
  }
  if (!parameters.empty()) wspec["arguments"] = {{"parameters", parameters}};
  if (const std::string sa = ArgoServiceAccount(spec, options); !sa.empty()) {
    wspec["serviceAccountName"] = sa;
  }
  wf["spec"] = wspec;
  return wf;
}

}  // namespace cohort::pipeline
