#include "tools/dgemma-run/RunDefaults.h"

#include <iostream>

#include "support/Error.h"

namespace dgemma::tool {

void applyPlanRunDefaults(CLI::App& train, const Plan& plan, const std::string& planPath) {
  if (!plan.runDefaults) return;
  auto given = [&](const std::string& flag) { return train.get_option(flag)->count() > 0; };
  std::string filled;
  for (const auto& [name, value] : plan.runDefaults->trainFlags.items()) {
    const std::string flag = "--" + name;
    const std::string where = planPath + ": run_defaults.train." + name;
    CLI::Option* option;
    try {
      option = train.get_option(flag);
    } catch (const CLI::OptionNotFound&) {
      throw InputError(where + ": not a dgemma-run train flag");
    }
    if (given(flag) || (name == "decay-steps" && given("--steps")) || (name == "save-every" && !given("--save-dir"))) continue;
    const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    option->add_result(text);
    try {
      option->run_callback();
    } catch (const CLI::ParseError& error) {
      throw InputError(where + ": " + error.what());
    }
    filled += " " + flag + " " + text;
  }
  if (!filled.empty() && plan.rank == 0)
    std::cout << "defaults of the plan's preset " << plan.runDefaults->preset << ":" << filled << "\n";
}

}  // namespace dgemma::tool
