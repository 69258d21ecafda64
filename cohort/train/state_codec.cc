// StateCodec (see state_codec.h). Thread-safety: the only locking is of torch's default
// generator while its state is read or set.
#include "cohort/train/state_codec.h"

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "cohort/base/json_bounded.h"
#include "cohort/base/log.h"

namespace cohort::train {
namespace {

using json = nlohmann::json;

// torch's generator hands out its own std::mutex (at::Generator::mutex()), which other
// torch code locks too, so these two stay std::lock_guard: a cohort::Mutex cannot stand in.
torch::Tensor GetTorchRngState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetTorchRngState(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// First difference between two signatures, for the error message.
std::string FirstDifference(const std::string& saved, const std::string& current) {
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ';')) out.push_back(item);
    return out;
  };
  auto a = split(saved), b = split(current);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    std::string x = i < a.size() ? a[i] : "(nothing)";
    std::string y = i < b.size() ? b[i] : "(nothing)";
    if (x != y) return fmt::format("checkpoint has {} where the model has {}", x, y);
  }
  return "signatures differ";
}

}  // namespace

std::string ModelSignature(torch::nn::Module& model) {
  std::string sig;
  auto add = [&](const std::string& name, const torch::Tensor& t) {
    if (!sig.empty()) sig += ';';
    sig += name + ":" + std::string(c10::toString(t.scalar_type())) + "[";
    for (int64_t d = 0; d < t.dim(); ++d) sig += (d ? "," : "") + std::to_string(t.size(d));
    sig += "]";
  };
  for (auto& p : model.named_parameters(true)) add(p.key(), p.value());
  for (auto& b : model.named_buffers(true)) {
    if (b.value().defined()) add(b.key(), b.value());
  }
  return sig;
}

namespace {

constexpr char kRawFormat[] = "raw1";

// The optimizer's per-parameter state tensors, by "opt:<group>.<index>.<field>", and the
// scalar state (Adam's step) by "<group>.<index>".
struct OptimizerTensors {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  json steps = json::object();
};

OptimizerTensors OptimizerState(torch::optim::Optimizer& optimizer) {
  OptimizerTensors out;
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = optimizer.state().find(c10::guts::to_string(params[i].unsafeGetTensorImpl()));
      if (it == optimizer.state().end()) continue;
      const std::string id = fmt::format("{}.{}", g, i);
      auto add = [&](const char* field, const torch::Tensor& t) {
        if (t.defined()) out.tensors.emplace_back(fmt::format("opt:{}.{}", id, field), t);
      };
      if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        add("momentum_buffer", sgd->momentum_buffer());
      } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
        out.steps[id] = adam->step();
        add("exp_avg", adam->exp_avg());
        add("exp_avg_sq", adam->exp_avg_sq());
        add("max_exp_avg_sq", adam->max_exp_avg_sq());
      }
    }
  }
  return out;
}

std::vector<int64_t> Shape(const torch::Tensor& t) { return t.sizes().vec(); }

}  // namespace

Result<StateCodec::Plan> StateCodec::PlanEncoding(const TrainState& state,
                                                  torch::nn::Module& model,
                                                  torch::optim::Optimizer* optimizer) const {
  Plan plan;
  json opt_steps = json::object();
  std::vector<std::string> names;
  auto add = [&](const std::string& name, const torch::Tensor& tensor) {
    names.push_back(name);
    plan.tensors.push_back(tensor.detach().contiguous());
  };
  try {
    for (auto& p : model.named_parameters(true)) add("param:" + p.key(), p.value());
    for (auto& b : model.named_buffers(true)) {
      if (b.value().defined()) add("buffer:" + b.key(), b.value());
    }
    if (optimizer != nullptr) {
      OptimizerTensors o = OptimizerState(*optimizer);
      for (auto& [name, t] : o.tensors) add(name, t);
      opt_steps = std::move(o.steps);
    }
    add("rng_torch", GetTorchRngState());
  } catch (const c10::Error& e) {
    return Internal("listing the training state: {}", e.what_without_backtrace());
  }
  std::vector<size_t> sizes;
  for (const torch::Tensor& t : plan.tensors) {
    if (!t.device().is_cpu()) return Internal("the training state must be in CPU memory");
    sizes.push_back(t.nbytes());
  }
  const std::vector<size_t> offsets = AlignedOffsets(sizes, &plan.payload_size);
  json records = json::array();
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const torch::Tensor& t = plan.tensors[i];
    records.push_back({names[i], std::string(c10::toString(t.scalar_type())), Shape(t),
                       offsets[i], sizes[i]});
    plan.pieces.push_back({t.data_ptr(), sizes[i], offsets[i]});
  }
  json meta = {{"format", kRawFormat},
               {"model", model_name_},
               {"optimizer", optimizer_name_},
               {"signature", ModelSignature(model)},
               {"global_step", state.global_step},
               {"epoch", state.epoch},
               {"batch_in_epoch", state.batch_in_epoch},
               {"seed", state.seed},
               {"world_size", state.world_size},
               {"batch_size", state.batch_size},
               {"optimizer_steps", opt_steps},
               {"tensors", records}};
  plan.meta = meta.dump();
  return plan;
}

uint32_t StateCodec::Plan::Fill(char* payload, uint32_t crc) const {
  return FillPayload(pieces, payload_size, payload, crc);
}

Result<CheckpointBlob> StateCodec::Encode(const TrainState& state, torch::nn::Module& model,
                                          torch::optim::Optimizer* optimizer) const {
  COHORT_ASSIGN_OR_RETURN(Plan plan, PlanEncoding(state, model, optimizer));
  CheckpointBlob blob;
  blob.meta = std::move(plan.meta);
  blob.payload.resize(plan.payload_size);
  plan.Fill(blob.payload.data(), 0);
  return blob;
}

Result<TrainState> StateCodec::Decode(CheckpointBlob blob, const std::string& what,
                                      torch::nn::Module& model,
                                      torch::optim::Optimizer* optimizer,
                                      bool* wrong_model) const {
  return Decode(CheckpointView{blob.meta, blob.payload}, what, model, optimizer, wrong_model);
}

Result<TrainState> StateCodec::Decode(CheckpointView blob, const std::string& path,
                                      torch::nn::Module& model,
                                      torch::optim::Optimizer* optimizer,
                                      bool* wrong_model) const {
  bool ignored = false;
  if (wrong_model == nullptr) wrong_model = &ignored;
  json meta;
  TrainState state;
  std::string saved_model, saved_opt, saved_sig;
  // Every field is checked before it is used: a checksum-valid file may still come from a
  // hostile or buggy writer, and a field out of range must be a data-loss error here, not
  // an overflow or a failed CHECK later (world_size -3, batch_size 0, global_step 1e30).
  try {
    meta = ParseJsonBounded(blob.meta, 16u << 20);
    if (!meta.is_object()) return DataLoss("{}: bad metadata: not a JSON object", path);
    saved_model = meta.at("model").get<std::string>();
    saved_opt = meta.at("optimizer").get<std::string>();
    saved_sig = meta.at("signature").get<std::string>();
    auto integer = [&](const char* key, int64_t lo, int64_t hi) -> Result<int64_t> {
      const json& v = meta.at(key);
      if (!v.is_number_integer()) return DataLoss("{}: bad metadata: {} is not an integer", path, key);
      const bool out_of_range =
          v.is_number_unsigned()
              ? v.get<uint64_t>() > static_cast<uint64_t>(hi) ||
                    static_cast<int64_t>(v.get<uint64_t>()) < lo
              : v.get<int64_t>() < lo || v.get<int64_t>() > hi;
      if (out_of_range) {
        return DataLoss("{}: bad metadata: {} is {}, outside {}..{}", path, key, v.dump(), lo, hi);
      }
      return v.get<int64_t>();
    };
    constexpr int64_t kMaxCount = int64_t{1} << 53;
    COHORT_ASSIGN_OR_RETURN(state.global_step, integer("global_step", 0, kMaxCount));
    COHORT_ASSIGN_OR_RETURN(state.epoch, integer("epoch", 0, kMaxCount));
    COHORT_ASSIGN_OR_RETURN(state.batch_in_epoch, integer("batch_in_epoch", 0, kMaxCount));
    COHORT_ASSIGN_OR_RETURN(int64_t world, integer("world_size", 1, 1 << 24));
    state.world_size = static_cast<int>(world);
    // 0: not recorded (files of tests and older writers); the position is then not rescaled.
    COHORT_ASSIGN_OR_RETURN(state.batch_size, integer("batch_size", 0, 1 << 30));
    int64_t samples = 0;  // what a resume at another world size computes: it must fit
    if (__builtin_mul_overflow(state.batch_in_epoch, state.batch_size, &samples) ||
        __builtin_mul_overflow(samples, int64_t{state.world_size}, &samples)) {
      return DataLoss("{}: bad metadata: batch_in_epoch {} x batch_size {} x world_size {} "
                      "overflows", path, state.batch_in_epoch, state.batch_size,
                      state.world_size);
    }
    if (!meta.at("seed").is_number_integer()) {
      return DataLoss("{}: bad metadata: seed is not an integer", path);
    }
    state.seed = meta.at("seed").get<uint64_t>();
  } catch (const json::exception& e) {
    return DataLoss("{}: bad metadata: {}", path, e.what());
  }
  // The checksum matched, so a mismatch is a real difference, not corruption.
  if (saved_model != model_name_) {
    *wrong_model = true;
    return FailedPrecondition(
        "checkpoint {} is from model '{}', not '{}'; use another --checkpoint-dir or the "
        "same --model", path, saved_model, model_name_);
  }
  std::string sig = ModelSignature(model);
  if (saved_sig != sig) {
    *wrong_model = true;
    return FailedPrecondition("checkpoint {} does not fit model '{}': {}", path, model_name_,
                              FirstDifference(saved_sig, sig));
  }
  if (optimizer != nullptr && saved_opt != optimizer_name_) {
    *wrong_model = true;
    return FailedPrecondition("checkpoint {} was trained with optimizer '{}', not '{}'", path,
                              saved_opt, optimizer_name_);
  }
  const bool raw = meta.contains("format");
  Status st = raw ? DecodeRaw(meta, blob.payload, path, model, optimizer)
                  : DecodeArchive(blob.payload, path, model, optimizer);
  if (!st.ok()) return st;
  return state;
}

namespace {

// A parameter of the optimizer and its state's fields in the payload.
struct OptParam {
  torch::Tensor param;
  std::map<std::string, std::pair<const char*, size_t>> fields;  // field -> (bytes, n)
};

// The optimizer's state from checked records (`steps`: Adam's step count per parameter).
void RestoreOptimizerState(const std::string& optimizer_name, const json& steps,
                           std::map<std::string, OptParam>& opt_params,
                           torch::optim::Optimizer& optimizer) {
  auto tensor_from = [](const torch::Tensor& like, std::pair<const char*, size_t> bytes) {
    torch::Tensor t = torch::empty_like(like, torch::MemoryFormat::Contiguous);
    std::memcpy(t.data_ptr(), bytes.first, bytes.second);
    return t;
  };
  optimizer.state().clear();
  for (auto& [id, op] : opt_params) {
    if (op.fields.empty()) continue;
    const std::string key = c10::guts::to_string(op.param.unsafeGetTensorImpl());
    if (optimizer_name == "sgd") {
      auto st = std::make_unique<torch::optim::SGDParamState>();
      if (op.fields.count("momentum_buffer")) {
        st->momentum_buffer(tensor_from(op.param, op.fields["momentum_buffer"]));
      }
      optimizer.state()[key] = std::move(st);
    } else {
      auto st = std::make_unique<torch::optim::AdamParamState>();
      st->step(steps.contains(id) && steps[id].is_number_integer() ? steps[id].get<int64_t>()
                                                                    : 0);
      auto field = [&](const char* name) {
        auto it = op.fields.find(name);
        return it == op.fields.end() ? torch::Tensor() : tensor_from(op.param, it->second);
      };
      st->exp_avg(field("exp_avg"));
      st->exp_avg_sq(field("exp_avg_sq"));
      st->max_exp_avg_sq(field("max_exp_avg_sq"));
      optimizer.state()[key] = std::move(st);
    }
  }
}

}  // namespace

// Every record is checked against the model and optimizer before anything is copied, so
// a bad file leaves them untouched (the checksum already matched: copying cannot fail).
Status StateCodec::DecodeRaw(const json& meta, std::string_view payload, const std::string& what,
                             torch::nn::Module& model, torch::optim::Optimizer* optimizer) const {
  if (meta.at("format") != kRawFormat) {
    return DataLoss("{}: payload format {} is not supported", what, meta.at("format").dump());
  }
  std::map<std::string, torch::Tensor> targets;
  for (auto& p : model.named_parameters(true)) targets["param:" + p.key()] = p.value();
  for (auto& b : model.named_buffers(true)) {
    if (b.value().defined()) targets["buffer:" + b.key()] = b.value();
  }
  std::map<std::string, OptParam> opt_params;  // "<group>.<index>"
  if (optimizer != nullptr) {
    auto& groups = optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t i = 0; i < groups[g].params().size(); ++i) {
        opt_params[fmt::format("{}.{}", g, i)].param = groups[g].params()[i];
      }
    }
  }
  std::vector<std::pair<torch::Tensor, const char*>> copies;
  const char* rng = nullptr;
  size_t rng_bytes = 0;
  size_t model_tensors = 0;
  try {
    const json& records = meta.at("tensors");
    if (!records.is_array()) return DataLoss("{}: bad metadata: tensors is not a list", what);
    for (const json& r : records) {
      if (!r.is_array() || r.size() != 5) return DataLoss("{}: bad tensor record", what);
      const std::string name = r[0].get<std::string>(), dtype = r[1].get<std::string>();
      const std::vector<int64_t> shape = r[2].get<std::vector<int64_t>>();
      const uint64_t offset = r[3].get<uint64_t>(), bytes = r[4].get<uint64_t>();
      if (offset > payload.size() || bytes > payload.size() - offset) {
        return DataLoss("{}: tensor {} lies outside the payload", what, name);
      }
      const char* src = payload.data() + offset;
      if (name == "rng_torch") {
        rng = src;
        rng_bytes = bytes;
        continue;
      }
      torch::Tensor like;
      std::string field;
      if (auto t = targets.find(name); t != targets.end()) {
        like = t->second;
        ++model_tensors;
      } else if (name.rfind("opt:", 0) == 0 && optimizer != nullptr) {
        const std::string rest = name.substr(4);
        const size_t dot = rest.rfind('.');
        auto op = dot == std::string::npos ? opt_params.end() : opt_params.find(rest.substr(0, dot));
        if (op == opt_params.end()) return DataLoss("{}: unknown optimizer state {}", what, name);
        like = op->second.param;
        field = rest.substr(dot + 1);
        op->second.fields[field] = {src, bytes};
      } else {
        return DataLoss("{}: tensor {} is not part of this model", what, name);
      }
      if (dtype != c10::toString(like.scalar_type()) || shape != Shape(like) ||
          bytes != like.nbytes()) {
        return DataLoss("{}: tensor {} is {}{} in the file but {}{} here", what, name, dtype,
                        json(shape).dump(), c10::toString(like.scalar_type()),
                        json(Shape(like)).dump());
      }
      if (field.empty()) copies.emplace_back(like, src);
    }
  } catch (const json::exception& e) {
    return DataLoss("{}: bad metadata: {}", what, e.what());
  }
  if (model_tensors != targets.size()) {
    return DataLoss("{}: {} of the model's {} tensors are missing", what,
                    targets.size() - model_tensors, targets.size());
  }
  if (rng == nullptr) return DataLoss("{}: no generator state", what);
  const json steps = meta.value("optimizer_steps", json::object());
  // Checked; now applied.
  {
    torch::NoGradGuard no_grad;
    for (auto& [dst, src] : copies) std::memcpy(dst.data_ptr(), src, dst.nbytes());
  }
  if (optimizer != nullptr) RestoreOptimizerState(optimizer_name_, steps, opt_params, *optimizer);
  torch::Tensor rng_state = torch::empty({static_cast<int64_t>(rng_bytes)}, torch::kUInt8);
  std::memcpy(rng_state.data_ptr(), rng, rng_bytes);
  try {
    SetTorchRngState(rng_state);
  } catch (const c10::Error& e) {
    return DataLoss("{}: bad generator state: {}", what, e.what_without_backtrace());
  }
  return Status::Ok();
}

// The earlier format: a torch archive. Read into fresh tensors first, then copied into the
// model, so that a failure half-way leaves the model untouched.
Status StateCodec::DecodeArchive(std::string_view payload, const std::string& path,
                                 torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer) const {
  try {
    std::istringstream in{std::string(payload)};
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    torch::serialize::InputArchive model_archive;
    archive.read("model", model_archive);
    std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
    for (auto& p : model.named_parameters(true)) {
      torch::Tensor t;
      model_archive.read(p.key(), t);
      copies.emplace_back(p.value(), t);
    }
    for (auto& b : model.named_buffers(true)) {
      if (!b.value().defined()) continue;
      torch::Tensor t;
      model_archive.read(b.key(), t, /*is_buffer=*/true);
      copies.emplace_back(b.value(), t);
    }
    torch::Tensor rng;
    archive.read("rng_torch", rng, /*is_buffer=*/true);
    torch::serialize::InputArchive opt_archive;
    bool has_opt = archive.try_read("optimizer", opt_archive);
    if (optimizer != nullptr && !has_opt) return DataLoss("{}: no optimizer state", path);
    {
      torch::NoGradGuard no_grad;
      for (auto& [dst, src] : copies) dst.copy_(src);
    }
    if (optimizer != nullptr) optimizer->load(opt_archive);
    SetTorchRngState(rng);
  } catch (const c10::Error& e) {
    return DataLoss("{}: cannot read the tensor archive: {}", path, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return DataLoss("{}: cannot read the tensor archive: {}", path, e.what());
  }
  return Status::Ok();
}

}  // namespace cohort::train
