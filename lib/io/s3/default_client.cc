#include "lib/io/s3/default_client.h"

#include <atomic>
#include <memory>

#include "lib/core/status.h"
#include "lib/io/s3/s3_config.h"

namespace reshard {

namespace {

// Set once the shared client exists.
std::atomic<S3Client*> created_client{nullptr};

}  // namespace

absl::StatusOr<S3Client*> DefaultS3Client() {
  // Built once; never destroyed (readers on other threads may still hold it at exit).
  static const absl::StatusOr<S3Client*>* const client = [] {
    absl::StatusOr<S3Config> config = S3ConfigFromEnv(ProcessEnv());
    if (!config.ok()) {
      return new absl::StatusOr<S3Client*>(
          Annotate(config.status(), "configuring S3 access from the environment"));
    }
    S3Client::Options options;
    options.config = *std::move(config);
    absl::StatusOr<std::unique_ptr<S3Client>> created = S3Client::Create(std::move(options));
    if (!created.ok()) return new absl::StatusOr<S3Client*>(created.status());
    created_client.store(created->get());
    return new absl::StatusOr<S3Client*>(created->release());
  }();
  return *client;
}

std::optional<S3ClientStats> DefaultS3ClientStats() {
  S3Client* const client = created_client.load();
  if (client == nullptr) return std::nullopt;
  return client->stats();
}

}  // namespace reshard
