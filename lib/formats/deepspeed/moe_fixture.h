// DeepSpeed mixture-of-experts saves for the conformance suite (moe_fixture.cc registers them
// as fixtures of "deepspeed-zero", see lib/formats/format_fixture.h), for tests that read them
// with options the suite does not set.
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_MOE_FIXTURE_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_MOE_FIXTURE_H_

#include <string>

#include "lib/formats/format_fixture.h"

namespace reshard {

// The "moe-zero2" fixture (see moe_fixture.cc): a DeepSpeed MoE save trained with ZeRO-2 on 4
// ranks at EP 2. With `moments`, `expected` also lists the Adam moments --include-optimizer
// reads, "<param>.exp_avg" and "<param>.exp_avg_sq" after the model's tensors (each fp32
// master weight plus 100 and plus 200).
BuiltFixture WriteMoeZeroFolder(const std::string& dir, bool moments);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_MOE_FIXTURE_H_
