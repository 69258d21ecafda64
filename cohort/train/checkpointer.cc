// Checkpointer (see checkpointer.h). Thread-safety: one owner; the only locking is of
// torch's default generator while its state is read or set.
#include "cohort/train/checkpointer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

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

Checkpointer::Checkpointer(std::string dir, std::string model_name, std::string optimizer_name,
                           int keep)
    : dir_(std::move(dir)), codec_(std::move(model_name), std::move(optimizer_name)),
      keep_(keep) {}

Status Checkpointer::Save(const TrainState& state, torch::nn::Module& model,
                          torch::optim::Optimizer* optimizer) {
  COHORT_ASSIGN_OR_RETURN(CheckpointBlob blob, codec_.Encode(state, model, optimizer));
  std::string path = dir_.PathFor(state.global_step);
  Status st = dir_.Write(state.global_step, blob, keep_);
  if (!st.ok()) return st.WithContext("saving checkpoint " + path);
  COHORT_LOG_DEBUG("train", "checkpoint {} written ({} bytes)", path, blob.payload.size());
  return Status::Ok();
}

Result<CheckpointBlob> StateCodec::Encode(const TrainState& state, torch::nn::Module& model,
                                          torch::optim::Optimizer* optimizer) const {
  CheckpointBlob blob;
  json meta = {{"model", model_name_},
               {"optimizer", optimizer_name_},
               {"signature", ModelSignature(model)},
               {"global_step", state.global_step},
               {"epoch", state.epoch},
               {"batch_in_epoch", state.batch_in_epoch},
               {"seed", state.seed},
               {"world_size", state.world_size},
               {"batch_size", state.batch_size}};
  blob.meta = meta.dump();
  try {
    torch::NoGradGuard no_grad;
    torch::serialize::OutputArchive archive;
    torch::serialize::OutputArchive model_archive;
    for (auto& p : model.named_parameters(true)) model_archive.write(p.key(), p.value());
    for (auto& b : model.named_buffers(true)) {
      if (b.value().defined()) model_archive.write(b.key(), b.value(), /*is_buffer=*/true);
    }
    archive.write("model", model_archive);
    if (optimizer != nullptr) {
      torch::serialize::OutputArchive opt_archive;
      optimizer->save(opt_archive);
      archive.write("optimizer", opt_archive);
    }
    archive.write("rng_torch", GetTorchRngState(), /*is_buffer=*/true);
    std::ostringstream out;
    archive.save_to(out);
    blob.payload = std::move(out).str();
  } catch (const c10::Error& e) {
    return Internal("serialising the training state: {}", e.what_without_backtrace());
  }
  return blob;
}

Result<TrainState> Checkpointer::LoadLatest(torch::nn::Module& model,
                                            torch::optim::Optimizer* optimizer) {
  std::vector<int64_t> steps = dir_.Steps();
  if (steps.empty()) return NotFound("no checkpoint in {}", dir_.dir());
  for (size_t k = steps.size(); k-- > 0;) {
    std::string path = dir_.PathFor(steps[k]);
    bool wrong_model = false;
    Result<TrainState> r = LoadFile(path, model, optimizer, &wrong_model);
    if (r.ok()) {
      loaded_path_ = path;
      return r;
    }
    if (wrong_model) return r.status();
    COHORT_LOG_WARN("train", "skipping unusable checkpoint: {}{}", r.status().ToString(),
                    k > 0 ? "; trying the previous one" : "");
  }
  // Not "start from scratch": the user's progress is there but unreadable.
  return DataLoss("no usable checkpoint in {}: {} found, none readable; move them away to "
                  "start from scratch, or restore a good one",
                  dir_.dir(), steps.size());
}

Result<TrainState> Checkpointer::LoadFile(const std::string& path, torch::nn::Module& model,
                                          torch::optim::Optimizer* optimizer,
                                          bool* wrong_model) {
  COHORT_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  COHORT_ASSIGN_OR_RETURN(CheckpointBlob blob, DecodeCheckpoint(bytes, path));
  return codec_.Decode(std::move(blob), path, model, optimizer, wrong_model);
}

Result<TrainState> StateCodec::Decode(CheckpointBlob blob, const std::string& path,
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
    meta = ParseJsonBounded(blob.meta, 1u << 20);
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
  // Read everything into fresh tensors first, then copy into the model, so that a failure
  // half-way leaves the model untouched.
  try {
    std::istringstream in(std::move(blob.payload));
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
    {
      torch::NoGradGuard no_grad;
      for (auto& [dst, src] : copies) dst.copy_(src);
    }
    if (optimizer != nullptr) {
      if (!has_opt) return DataLoss("{}: no optimizer state", path);
      optimizer->load(opt_archive);
    }
    SetTorchRngState(rng);
  } catch (const c10::Error& e) {
    return DataLoss("{}: cannot read the tensor archive: {}", path, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return DataLoss("{}: cannot read the tensor archive: {}", path, e.what());
  }
  return state;
}

}  // namespace cohort::train
