// The typed JSON field reader (runtime/core/json_fields.h): what each read accepts and the
// "<where>: <field>: <what>" messages of what it refuses.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "runtime/core/json_fields.h"

using namespace mfsdp;
using Catch::Matchers::Equals;
using json = nlohmann::json;

namespace {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

TEST_CASE("json fields: typed reads and their messages", "[json_fields]") {
  const json doc = json::parse(R"({"n": 3, "big": 18446744073709551615, "x": 0.5, "f": true, "s": "hi",
                                   "list": [{"k": "v"}, 7], "nul": null, "v": [1, 2]})");
  const JsonFields<InputError> f("in.json");
  CHECK(f.at(doc, "n").integer(0, 3) == 3);
  CHECK(f.at(doc, "x").number() == 0.5);
  CHECK(f.at(doc, "n").number(0, 3) == 3.0);
  CHECK(f.at(doc, "f").boolean());
  CHECK(f.at(doc, "s").string() == "hi");
  CHECK(f.at(doc, "v").get<std::vector<int>>() == std::vector<int>{1, 2});
  CHECK(f.at(doc, "x").get<int>() == 0);  // nlohmann's conversion, as documented
  CHECK_FALSE(f.find(doc, "absent").has_value());
  CHECK(f.find(doc, "nul")->value().is_null());

  CHECK_THROWS_AS(f.at(doc, "absent"), InputError);
  CHECK_THROWS_WITH(f.at(doc, "absent"), Equals("in.json: absent: missing"));
  CHECK_THROWS_WITH(f.at(doc, "x").integer(), Equals("in.json: x: expected an integer, got 0.5"));
  CHECK_THROWS_WITH(f.at(doc, "big").integer(), Equals("in.json: big: must be <= 9223372036854775807, got 18446744073709551615"));
  CHECK_THROWS_WITH(f.at(doc, "n").integer(4), Equals("in.json: n: must be >= 4, got 3"));
  CHECK_THROWS_WITH(f.at(doc, "n").integer(0, 2), Equals("in.json: n: must be <= 2, got 3"));
  CHECK_THROWS_WITH(f.at(doc, "s").number(), Equals("in.json: s: expected a number, got \"hi\""));
  CHECK_THROWS_WITH(f.at(doc, "x").number(0.5, 1, true), Equals("in.json: x: must be > 0.5, got 0.5"));
  CHECK_THROWS_WITH(f.at(doc, "x").number(0, 0.5, false, true), Equals("in.json: x: must be < 0.5, got 0.5"));
  CHECK_THROWS_WITH(f.at(doc, "n").boolean(), Equals("in.json: n: expected true or false, got 3"));
  CHECK_THROWS_WITH(f.at(doc, "f").string(), Equals("in.json: f: expected a string, got true"));
  CHECK_THROWS_WITH(f.at(doc, "s").get<std::vector<int>>(), Equals("in.json: s: type must be array, but is string"));
  CHECK_THROWS_WITH(f.field(json(1e300 * 1e300), "inf").number(0, 1), Equals("in.json: inf: must be finite, got inf"));

  // nested levels name the path; a level that is not an object is refused by its own name
  const JsonFields<InputError> list = f.in("list");
  CHECK(list.in("[0]").at(doc["list"][0], "k").string() == "v");
  CHECK_THROWS_WITH(list.in("[0]").at(doc["list"][0], "q"), Equals("in.json: list[0].q: missing"));
  CHECK_THROWS_WITH(list.in("[1]").at(doc["list"][1], "k"), Equals("in.json: list[1]: expected an object, got 7"));
  CHECK_THROWS_WITH(f.at(doc["list"], "k"), Equals("in.json: expected an object, got [{\"k\":\"v\"},7]"));
  CHECK_THROWS_WITH(list.fail("", "too short"), Equals("in.json: list: too short"));
}
