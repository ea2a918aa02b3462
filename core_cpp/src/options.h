// The generation options as one table: name, kind, allowed range, one line of help, and how to
// read and write the field of GenerateParams. The engine validates with it, and the Python
// package, the CLI flags and the Studio's settings panel are all built from it (via diffuse._core).
#pragma once

#include "diffuse.h"

#include <string>
#include <vector>

namespace diffuse {

enum class OptionKind { Int, Float, Bool, Choice, Seed };

struct OptionInfo {
    const char * name;
    OptionKind   kind;
    double       lo, hi;            // numeric range, inclusive unless open
    bool         lo_open, hi_open;
    const char * help;
    // Field access; numbers and bools travel as double, a choice as its name.
    double      (*get)(const GenerateParams &);
    void        (*set)(GenerateParams &, double);
    std::string (*get_choice)(const GenerateParams &);
    void        (*set_choice)(GenerateParams &, const std::string &);
    std::vector<std::string> (*choices)();   // a choice's allowed names
};

const std::vector<OptionInfo> & generate_options();
const OptionInfo & generate_option(const std::string & name);   // throws diffuse::Error

// The allowed values as text, e.g. "an integer in [1, 1048576]" or "one of: a, b".
std::string option_range_text(const OptionInfo & o);

// Throws diffuse::Error naming the option and its range when a value is outside it.
void check_option(const OptionInfo & o, double value);
void check_options(const GenerateParams & p);

}  // namespace diffuse
