// EnvSwitch (kernels/env_switch.h), the environment-and-code switches of the kernels (programmatic
// launch, batch norm's one-launch backward and its statistics): unset means the default (on unless the switch is
// made off by default), "0" off and "1" on, read once on first use; anything else is an error that names the
// variable, the value and what 0 and 1 mean; set() overrides the environment and returns the switch as it was;
// ScopedEnvSwitch puts it back.
#include <gtest/gtest.h>

#include <cstdlib>

#include "kernels/env_switch.h"
#include "test_util.h"

using namespace reel;

namespace {

// A variable of this test's own, set for a scope and removed after it.
struct ScopedVariable {
  ScopedVariable(const char* name, const char* value) : name(name) {
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedVariable() { unsetenv(name); }
  const char* name;
};

constexpr const char* kVariable = "REEL_TEST_ENV_SWITCH";

}  // namespace

TEST(EnvSwitch, UnsetIsOnZeroIsOffOneIsOn) {
  {
    ScopedVariable v(kVariable, nullptr);
    EnvSwitch s(kVariable, "plain", "fancy");
    EXPECT_TRUE(s.get());
  }
  {
    ScopedVariable v(kVariable, "0");
    EnvSwitch s(kVariable, "plain", "fancy");
    EXPECT_FALSE(s.get());
  }
  {
    ScopedVariable v(kVariable, "1");
    EnvSwitch s(kVariable, "plain", "fancy");
    EXPECT_TRUE(s.get());
  }
}

TEST(EnvSwitch, ReadsTheEnvironmentOnceAndSetOverridesIt) {
  ScopedVariable v(kVariable, "0");
  EnvSwitch s(kVariable, "plain", "fancy");
  EXPECT_FALSE(s.get());
  setenv(kVariable, "1", 1);
  EXPECT_FALSE(s.get()) << "read once, on first use";
  EXPECT_FALSE(s.set(true)) << "set returns the switch as it was";
  EXPECT_TRUE(s.get());
  {
    ScopedEnvSwitch off(s, false);
    EXPECT_FALSE(s.get());
  }
  EXPECT_TRUE(s.get()) << "the scope put it back";
}

TEST(EnvSwitch, ABadValueIsAnErrorNamingTheVariableAndTheChoices) {
  ScopedVariable v(kVariable, "yes");
  EnvSwitch s(kVariable, "plain launches", "fancy launches");
  testing_util::expect_error([&] { s.get(); },
                             {kVariable, "expected 0 (plain launches) or 1 (fancy launches, the default)", "'yes'"});
  EnvSwitch t(kVariable, "plain launches", "fancy launches");
  testing_util::expect_error([&] { t.set(false); }, {kVariable, "'yes'"});
}

TEST(EnvSwitch, ASwitchOffByDefaultIsOffUnsetAndSaysSoInTheError) {
  {
    ScopedVariable v(kVariable, nullptr);
    EnvSwitch s(kVariable, "plain", "fancy", /*default_on=*/false);
    EXPECT_FALSE(s.get());
    EXPECT_FALSE(s.set(true));
    EXPECT_TRUE(s.get());
  }
  {
    ScopedVariable v(kVariable, "1");
    EnvSwitch s(kVariable, "plain", "fancy", false);
    EXPECT_TRUE(s.get());
  }
  ScopedVariable v(kVariable, "2");
  EnvSwitch s(kVariable, "plain launches", "fancy launches", false);
  testing_util::expect_error([&] { s.get(); },
                             {kVariable, "expected 0 (plain launches, the default) or 1 (fancy launches)", "'2'"});
}
