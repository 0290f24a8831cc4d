#include "server/process_collector.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ctime>
#include <map>
#include <thread>

#include "gtest/gtest.h"

namespace reshard {
namespace {

TEST(ProcessCollectorTest, ReadsThisProcess) {
  auto stats = ReadProcessStats();
  ASSERT_TRUE(stats.has_value());
  EXPECT_GT(stats->resident_bytes, 1u << 20);
  EXPECT_GE(stats->virtual_bytes, stats->resident_bytes);
  EXPECT_GE(stats->cpu_seconds, 0);
  EXPECT_GE(stats->threads, 1);
  // Started within the last hour (tests are short), not in the future.
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(stats->start_time_seconds, now + 2);
  EXPECT_GT(stats->start_time_seconds, now - 3600);
  rlimit limit;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur != RLIM_INFINITY) {
    EXPECT_EQ(stats->max_fds, limit.rlim_cur);
  }
  // Opening a descriptor counts one more.
  const int64_t before = stats->open_fds;
  EXPECT_GE(before, 3);
  const int fd = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(ReadProcessStats()->open_fds, before + 1);
  ::close(fd);
  // A thread more.
  std::thread thread([&] { EXPECT_EQ(ReadProcessStats()->threads, stats->threads + 1); });
  thread.join();
}

TEST(ProcessCollectorTest, MissingProcessIsNullopt) {
  EXPECT_FALSE(ReadProcessStats("/proc/does-not-exist").has_value());
}

TEST(ProcessCollectorTest, CollectsTheStandardNames) {
  ProcessCollector collector;
  std::map<std::string, prometheus::MetricType> found;
  for (const prometheus::MetricFamily& family : collector.Collect()) {
    ASSERT_EQ(family.metric.size(), 1u) << family.name;
    found[family.name] = family.type;
  }
  const std::map<std::string, prometheus::MetricType> expected = {
      {"process_cpu_seconds_total", prometheus::MetricType::Counter},
      {"process_resident_memory_bytes", prometheus::MetricType::Gauge},
      {"process_virtual_memory_bytes", prometheus::MetricType::Gauge},
      {"process_start_time_seconds", prometheus::MetricType::Gauge},
      {"process_threads", prometheus::MetricType::Gauge},
      {"process_open_fds", prometheus::MetricType::Gauge},
      {"process_max_fds", prometheus::MetricType::Gauge},
      {"reshard_memory_in_use_bytes", prometheus::MetricType::Gauge},
  };
  EXPECT_EQ(found, expected);
}

}  // namespace
}  // namespace reshard
