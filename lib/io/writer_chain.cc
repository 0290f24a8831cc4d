#include "lib/io/writer_chain.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {

absl::StatusOr<std::unique_ptr<WriterChain>> WriterChain::ToFile(const Directory& dir, IoMode io,
                                                                 WriterChainSpec spec) {
  ASSIGN_OR_RETURN(AtomicFile created, AtomicFile::Create(dir, spec.name, io));
  auto file = std::make_unique<AtomicFileWriter>(std::move(created));
  AtomicFileWriter* local = file.get();
  std::unique_ptr<WriterChain> chain(new WriterChain());
  chain->local_ = local;
  RETURN_IF_ERROR(chain->Build(std::move(file), std::move(spec)));
  return chain;
}

absl::StatusOr<std::unique_ptr<WriterChain>> WriterChain::To(std::unique_ptr<ByteWriter> file,
                                                             WriterChainSpec spec) {
  std::unique_ptr<WriterChain> chain(new WriterChain());
  RETURN_IF_ERROR(chain->Build(std::move(file), std::move(spec)));
  return chain;
}

const std::vector<uint32_t>& WriterChain::crc32s() const {
  static const std::vector<uint32_t>* const kNone = new std::vector<uint32_t>();
  return crc32_ != nullptr ? crc32_->crc32s() : *kNone;
}

absl::Status WriterChain::Build(std::unique_ptr<ByteWriter> file, WriterChainSpec spec) {
  file_ = std::move(file);
  front_ = file_.get();
  if (!spec.crc32_ranges.empty()) {
    // The stream's XXH3 in the same pass as the ranges' CRC-32s (Crc32Writer).
    ASSIGN_OR_RETURN(crc32_,
                     Crc32Writer::Create(front_, std::move(spec.crc32_ranges), spec.xxh3_64),
                     absl::StrCat("the byte chain of ", spec.name));
    front_ = crc32_.get();
  } else if (spec.xxh3_64) {
    xxh3_ = std::make_unique<Xxh3Writer>(front_);
    front_ = xxh3_.get();
  }
  if (!spec.deferred.empty()) {
    if (!spec.produce) {
      return absl::InternalError(
          absl::StrCat(spec.name, ": deferred byte ranges but nothing to produce them"));
    }
    auto produce = [this, produce = std::move(spec.produce)](size_t range) {
      return produce(range, crc32s());
    };
    deferred_ = std::make_unique<DeferredBytesWriter>(front_, std::move(spec.deferred),
                                                      std::move(produce), spec.name);
    front_ = deferred_.get();
  }
  exact_ = std::make_unique<ExactSizeWriter>(front_, spec.size, spec.name);
  front_ = exact_.get();
  return absl::OkStatus();
}

}  // namespace reshard
