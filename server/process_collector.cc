#include "server/process_collector.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace reshard {
namespace {

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Seconds since the epoch at boot ("btime" in /proc/stat).
double BootTimeSeconds() {
  static const double boot = [] {
    auto stat = ReadSmallFile("/proc/stat");
    if (!stat.has_value()) return 0.0;
    for (absl::string_view line : absl::StrSplit(*stat, '\n')) {
      if (absl::ConsumePrefix(&line, "btime ")) {
        double value = 0;
        if (absl::SimpleAtod(line, &value)) return value;
      }
    }
    return 0.0;
  }();
  return boot;
}

int64_t CountOpenFds(const std::string& pid_dir) {
  DIR* dir = ::opendir((pid_dir + "/fd").c_str());
  if (dir == nullptr) return -1;
  int64_t count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count - 1;  // the descriptor of the listing itself
}

int64_t MaxFds(const std::string& pid_dir) {
  auto limits = ReadSmallFile(pid_dir + "/limits");
  if (!limits.has_value()) return -1;
  for (absl::string_view line : absl::StrSplit(*limits, '\n')) {
    if (!absl::ConsumePrefix(&line, "Max open files")) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t soft = 0;
    if (!fields.empty() && absl::SimpleAtoi(fields[0], &soft)) return soft;
    return -1;  // "unlimited"
  }
  return -1;
}

}  // namespace

std::optional<ProcessStats> ReadProcessStats(const std::string& pid_dir) {
  auto stat = ReadSmallFile(pid_dir + "/stat");
  if (!stat.has_value()) return std::nullopt;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields are counted
  // from after the last ')'. The first field there is field 3 (state) of proc(5).
  const size_t paren = stat->rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(*stat).substr(paren + 1), ' ', absl::SkipWhitespace());
  auto field = [&](int number, double* value) {  // proc(5) numbering
    const size_t index = static_cast<size_t>(number - 3);
    return index < fields.size() && absl::SimpleAtod(fields[index], value);
  };
  double utime, stime, threads, start_ticks, vsize, rss;
  if (!field(14, &utime) || !field(15, &stime) || !field(20, &threads) ||
      !field(22, &start_ticks) || !field(23, &vsize) || !field(24, &rss)) {
    return std::nullopt;
  }
  static const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  static const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  ProcessStats stats;
  stats.cpu_seconds = (utime + stime) / ticks;
  stats.threads = static_cast<int64_t>(threads);
  stats.start_time_seconds = BootTimeSeconds() + start_ticks / ticks;
  stats.virtual_bytes = static_cast<uint64_t>(vsize);
  stats.resident_bytes = static_cast<uint64_t>(rss * page);
  stats.open_fds = CountOpenFds(pid_dir);
  stats.max_fds = MaxFds(pid_dir);
  return stats;
}

prometheus::MetricFamily SingleValueFamily(const std::string& name, const std::string& help,
                                           prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

ProcessCollector::ProcessCollector() { ResetBaseline(); }

void ProcessCollector::ResetBaseline() {
  auto stats = ReadProcessStats();
  if (stats.has_value()) baseline_resident_bytes_.store(stats->resident_bytes);
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  auto stats = ReadProcessStats();
  if (!stats.has_value()) return families;  // a scrape without them beats a failed scrape
  families.push_back(SingleValueFamily("process_cpu_seconds_total",
                                       "Total user and system CPU time spent in seconds.",
                                       MetricType::Counter, stats->cpu_seconds));
  families.push_back(SingleValueFamily("process_resident_memory_bytes",
                                       "Resident memory size in bytes.", MetricType::Gauge,
                                       static_cast<double>(stats->resident_bytes)));
  families.push_back(SingleValueFamily("process_virtual_memory_bytes",
                                       "Virtual memory size in bytes.", MetricType::Gauge,
                                       static_cast<double>(stats->virtual_bytes)));
  families.push_back(SingleValueFamily("process_start_time_seconds",
                                       "Start time of the process since unix epoch in seconds.",
                                       MetricType::Gauge, stats->start_time_seconds));
  families.push_back(SingleValueFamily("process_threads", "Number of OS threads in the process.",
                                       MetricType::Gauge, static_cast<double>(stats->threads)));
  if (stats->open_fds >= 0) {
    families.push_back(SingleValueFamily("process_open_fds", "Number of open file descriptors.",
                                         MetricType::Gauge, static_cast<double>(stats->open_fds)));
  }
  if (stats->max_fds >= 0) {
    families.push_back(SingleValueFamily("process_max_fds",
                                         "Maximum number of open file descriptors.",
                                         MetricType::Gauge, static_cast<double>(stats->max_fds)));
  }
  const uint64_t baseline = baseline_resident_bytes_.load();
  const uint64_t in_use = stats->resident_bytes > baseline ? stats->resident_bytes - baseline : 0;
  families.push_back(
      SingleValueFamily("reshard_memory_in_use_bytes",
                        "Resident memory of the daemon above its idle baseline at start.",
                        MetricType::Gauge, static_cast<double>(in_use)));
  return families;
}

}  // namespace reshard
