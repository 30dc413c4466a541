// What every dgemma command-line tool shares: parsing with the exit codes of the CLI contract
// (docs/cli.md: 0 success, 2 bad usage or input, 1 runtime failure) and the
// top-level error handler.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <iostream>
#include <string>

#include "support/Error.h"

namespace dgemma {

// Parses argv; prints help (exit 0) or the usage error (exit 2) itself. Returns true to continue.
inline bool parseCommandLine(CLI::App& app, int argc, char** argv, int& exitCode) {
  try {
    app.parse(argc, argv);
    return true;
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    exitCode = 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    exitCode = 0;
  } catch (const CLI::ParseError& error) {
    std::cerr << app.get_name() << ": " << error.what() << "\n" << "Run with --help for usage.\n";
    exitCode = 2;
  }
  return false;
}

// Runs the tool body, turning dgemma errors into their exit codes with the message on stderr;
// `report`, when given, also receives that message (e.g. for a launcher's failure report).
inline int runReportingErrors(const std::string& tool, const std::function<int()>& body,
                              const std::function<void(const std::string&)>& report = {}) {
  std::string message;
  int exitCode;
  try {
    return body();
  } catch (const Error& error) {
    message = tool + ": error: " + error.what();
    exitCode = error.exitCode();
  } catch (const std::exception& error) {
    message = tool + ": internal error: " + error.what();
    exitCode = 1;
  }
  std::cerr << message << "\n";
  if (report) report(message);
  return exitCode;
}

}  // namespace dgemma
