#include "lib/formats/deepspeed/zero_pickle.h"

#include <deque>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "lib/formats/torch/pickle.h"

namespace reshard {
namespace zero_internal {
namespace {

using Kind = PickleValue::Kind;

// Owns the values a test builds.
class Values {
 public:
  PickleValue* Make(Kind kind) {
    values_.emplace_back();
    values_.back().kind = kind;
    return &values_.back();
  }
  PickleValue* Int(int64_t n) {
    PickleValue* value = Make(Kind::kInt);
    value->integer = n;
    return value;
  }
  PickleValue* String(std::string text) {
    PickleValue* value = Make(Kind::kString);
    value->text = std::move(text);
    return value;
  }
  PickleValue* Global(std::string module, std::string name) {
    PickleValue* value = Make(Kind::kGlobal);
    value->module = std::move(module);
    value->name = std::move(name);
    return value;
  }
  // getattr(ZeroStageEnum, `member`), as Python 3.11 pickles an Enum member.
  PickleValue* StageByName(std::string member) {
    PickleValue* args = Make(Kind::kTuple);
    args->items = {Global("deepspeed.runtime.zero.config", "ZeroStageEnum"),
                   String(std::move(member))};
    PickleValue* call = Make(Kind::kObject);
    call->callable = Global("builtins", "getattr");
    call->args = args;
    return call;
  }

 private:
  std::deque<PickleValue> values_;
};

TEST(ZeroStageTest, IntOrEnumMember) {
  Values v;
  EXPECT_EQ(ZeroStage(v.Int(2)), 2);
  EXPECT_EQ(ZeroStage(v.StageByName("disabled")), 0);
  EXPECT_EQ(ZeroStage(v.StageByName("optimizer_states")), 1);
  EXPECT_EQ(ZeroStage(v.StageByName("gradients")), 2);
  EXPECT_EQ(ZeroStage(v.StageByName("weights")), 3);
  EXPECT_EQ(ZeroStage(v.StageByName("max_stage")), 3);
  EXPECT_FALSE(ZeroStage(v.StageByName("other")).has_value());
  EXPECT_FALSE(ZeroStage(v.String("3")).has_value());
  EXPECT_FALSE(ZeroStage(nullptr).has_value());
}

// The member as the pickle VM reads Python 3.11's getattr(ZeroStageEnum, "gradients"): one
// global whose name is "ZeroStageEnum.gradients" (the VM's reading of getattr on a global).
TEST(ZeroStageTest, EnumMemberReadByThePickleMachine) {
  // protocol 2: getattr(deepspeed.runtime.zero.config.ZeroStageEnum, "gradients")
  const std::string data = std::string("\x80\x02", 2) + "c__builtin__\ngetattr\n" +
                           "cdeepspeed.runtime.zero.config\nZeroStageEnum\n" +
                           std::string("X\x09\x00\x00\x00", 5) + "gradients" + "\x86" + "R.";
  PickleArena arena;
  absl::StatusOr<PickleValue*> value = ParsePickle(data, arena, PersistentLoad());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(ZeroStage(*value), 2) << DescribePickleValue(*value);
  Values v;
  EXPECT_EQ(ZeroStage(v.Global("deepspeed.runtime.zero.config", "ZeroStageEnum.weights")), 3);
  EXPECT_FALSE(
      ZeroStage(v.Global("deepspeed.runtime.zero.config", "ZeroStageEnum.other")).has_value());
  EXPECT_FALSE(ZeroStage(v.Global("deepspeed.runtime.zero.config", "ZeroStageEnum")).has_value());
}

TEST(IntKeyFieldTest, FindsIntKeysOnly) {
  Values v;
  PickleValue* dict = v.Make(Kind::kDict);
  PickleValue* zero = v.String("zero");
  PickleValue* named = v.String("named");
  dict->entries = {{v.Int(0), zero}, {v.String("1"), named}};
  EXPECT_EQ(IntKeyField(dict, 0), zero);
  EXPECT_EQ(IntKeyField(dict, 1), nullptr);
  EXPECT_EQ(IntKeyField(v.Int(0), 0), nullptr);
  EXPECT_EQ(IntKeyField(nullptr, 0), nullptr);
}

TEST(IsNoneTest, AbsentOrNone) {
  Values v;
  EXPECT_TRUE(IsNone(nullptr));
  EXPECT_TRUE(IsNone(v.Make(Kind::kNone)));
  EXPECT_FALSE(IsNone(v.Int(0)));
}

}  // namespace
}  // namespace zero_internal
}  // namespace reshard
