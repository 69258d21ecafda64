// The job's directory of monitoring endpoints, kept in the job's store so that any agent
// (and `cohort top`) can show the whole job: each agent that serves a metrics endpoint
// publishes one record when it first joins, and an end record when it stops (succeeded,
// failed, interrupted). An agent killed outright writes no end record: readers show such a
// node as lost. Records are never removed during the job; a node that rejoins under a new
// agent gets a new entry.
//
// Keys (under the store the agent uses for the rendezvous; per job):
//   metrics/<run id>/node         tickets: entry i is the i-th agent to publish (1-based)
//   metrics/<run id>/node<i>      {"url", "host", "addr", "pid", "started"} (JSON)
//   metrics/<run id>/node<i>/end  {"state", "exit_code", "summary", "time"} (JSON)
//
// Thread-safety: free functions; the Store passed in must not be used by another thread
// during a call (stores are one-owner objects).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/metrics/job_view.h"
#include "cohort/store/job_store_access.h"
#include "cohort/store/store.h"

namespace cohort::agent {

using DirectoryEntry = metrics::EndpointEntry;

// Publishes `record` (must hold "url"); returns the entry's index.
Result<int> PublishEndpoint(store::Store& store, const std::string& run_id,
                            const nlohmann::json& record, Deadline deadline);
// Records how entry `index` ended.
Status PublishEnd(store::Store& store, const std::string& run_id, int index,
                  const nlohmann::json& end, Deadline deadline);
// Every entry, in index order (at most `max_entries`, the newest kept). An entry whose
// record is missing or is not JSON (being written, or foreign) is skipped.
Result<std::vector<DirectoryEntry>> ReadDirectory(store::Store& store, const std::string& run_id,
                                                  Deadline deadline, int max_entries = 4096);

// ReadDirectory as a function of no arguments (JobViewOptions::list) over a store
// connection of its own (`first`, or one made on first use), made again after a failure;
// each call bounded by `timeout`. One caller at a time (JobView serializes its calls).
using StoreConnector = store::StoreConnector;  // store/job_store_access.h
std::function<Result<std::vector<DirectoryEntry>>()> DirectoryReader(
    StoreConnector connect, std::string run_id, Duration timeout = std::chrono::seconds(2),
    std::shared_ptr<store::Store> first = nullptr);

}  // namespace cohort::agent
