// reshardctl's commands, as functions of their parsed flags that write to the given streams
// and return the process exit code. main() only parses the command line and calls these.

#ifndef RESHARD_CLIENT_COMMANDS_H_
#define RESHARD_CLIENT_COMMANDS_H_

#include <atomic>
#include <ostream>
#include <string>

namespace reshard {

struct OutputFlags {
  bool json = false;         // one JSON document on `out`
  bool progress = true;      // show progress on `err`
  bool terminal = false;     // `err` is a terminal: redraw a bar instead of plain lines
};

struct ConversionFlags {
  std::string input;
  std::string output;
  std::string dtype = "keep";
  std::string max_shard_size = "5GB";
  int parts = 0;
  std::string rules;
  int threads = 2;
  std::string window_size = "32MiB";
};

int RunInspect(const std::string& input, const std::string& rules, const OutputFlags& flags,
               std::ostream& out, std::ostream& err);

// `plan`: the dry run. parts > 0 plans a reshard into that many parts, else a consolidation.
int RunPlan(const ConversionFlags& conversion, const OutputFlags& flags, std::ostream& out,
            std::ostream& err);

// `consolidate` (parts == 0) and `reshard` (parts > 0).
int RunConvert(const ConversionFlags& conversion, bool reshard, const OutputFlags& flags,
               const std::atomic<bool>* cancelled, std::ostream& out, std::ostream& err);

int RunVerify(const std::string& a, const std::string& b, const std::string& rules,
              const OutputFlags& flags, const std::atomic<bool>* cancelled, std::ostream& out,
              std::ostream& err);

}  // namespace reshard

#endif  // RESHARD_CLIENT_COMMANDS_H_
