// Megatron-LM rank files for tests (the conformance fixture of "megatron" is in
// megatron_fixture.cc, see lib/formats/format_fixture.h).
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_FIXTURE_H_
#define RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_FIXTURE_H_

#include "lib/formats/torch/pickle_writer.h"

namespace reshard {

// The last entries of a model_optim_rng.pt dict, closing it: checkpoint_version 3.0 and
// iteration 1.
void WriteMegatronVersionAndIteration(PickleWriter& p);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_FIXTURE_H_
