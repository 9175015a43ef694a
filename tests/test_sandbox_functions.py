"""Terraform's built-in functions in the sandbox engine: the documented results, and Terraform's null,
unknown, type and sensitivity rules, on real stacks planned (and applied) through the engine.

The expected values are the examples of Terraform's function documentation
(developer.hashicorp.com/terraform/language/functions/<name>).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import hcl2
import pytest

from gateway.adapters.engines.sandbox.engine import SandboxEngine
from gateway.adapters.engines.sandbox.functions import CallContext, documented_names, supported_names
from gateway.adapters.engines.sandbox.hcl_eval import UNKNOWN, Evaluator
from gateway.adapters.engines.sandbox.values import Secret, Sensitive
from gateway.domain.errors import ConfigError
from gateway.domain.plan import ChangeKind
from gateway.ports import EnginePlan, StackInputs
from gateway.services.change.planning import plan_stack
from gateway.services.workspace import Workspace

from .conftest import Clone
from .fakes import FakeSandboxStore

DOC = Path(__file__).parent.parent / "docs" / "SANDBOX_FUNCTIONS.md"


def evaluate(expression: str, **scope: Any) -> Any:
    tree = hcl2.parses_to_tree(f"x = {expression}\n")
    attribute = next(tree.find_data("attribute"))
    return Evaluator(scope, "test", CallContext(), "test.tf").eval(attribute.children[-1])


# (expression, Terraform's documented result)
DOCUMENTED = [
    ("abs(-12.4)", 12.4), ("ceil(5.1)", 6), ("floor(4.9)", 4), ("log(16, 2)", 4), ("max(12, 54, 3)", 54),
    ("min(12, 54, 3)", 3), ('parseint("100", 10)', 100), ('parseint("FF", 16)', 255), ('parseint("-10", 2)', -2),
    ('parseint("zz", 36)', 1295), ("pow(3, 2)", 9), ("signum(-13)", -1), ("signum(0)", 0),
    ('chomp("hello\\n\\n")', "hello"), ('endswith("hello world", "world")', True),
    ('format("Hello, %s!", "Ander")', "Hello, Ander!"), ('format("There are %d lights", 4)', "There are 4 lights"),
    ('format("%-5s|%05d|%.2f|%q|%v", "a", 42, 3.14159, "x", true)', 'a    |00042|3.14|"x"|true'),
    ('formatlist("Hello, %s!", ["Valentina", "Ander", "Olivia", "Sam"])',
     ["Hello, Valentina!", "Hello, Ander!", "Hello, Olivia!", "Hello, Sam!"]),
    ('formatlist("%s, %s!", "Salutations", ["Valentina", "Ander"])', ["Salutations, Valentina!", "Salutations, Ander!"]),
    ('indent(2, "[\\n  foo,\\n  bar,\\n]\\n")', "[\n    foo,\n    bar,\n  ]\n  "),
    ('join(", ", ["foo", "bar", "baz"])', "foo, bar, baz"), ('lower("HELLO")', "hello"),
    ('regex("[a-z]+", "53453453.345345aaabbbccc23454")', "aaabbbccc"),
    ('regex("(\\\\d\\\\d\\\\d\\\\d)-(\\\\d\\\\d)-(\\\\d\\\\d)", "2019-02-01")', ["2019", "02", "01"]),
    ('regex("^(?:(?P<scheme>[^:/?#]+):)?(?://(?P<authority>[^/?#]*))?", "https://terraform.io/docs/")',
     {"scheme": "https", "authority": "terraform.io"}),
    ('regexall("[a-z]+", "1234abcd5678efgh9")', ["abcd", "efgh"]), ('length(regexall("[a-z]+", "123"))', 0),
    ('replace("1 + 2 + 3", "+", "-")', "1 - 2 - 3"), ('replace("hello world", "/w.*d/", "everybody")', "hello everybody"),
    ('split(",", "foo,bar,baz")', ["foo", "bar", "baz"]), ('split(",", "")', [""]),
    ('startswith("hello world", "hello")', True), ('strcontains("hello world", "wor")', True),
    ('strrev("hello")', "olleh"), ('substr("hello world", 1, 4)', "ello"), ('substr("hello world", -5, -1)', "world"),
    ('title("hello world")', "Hello World"), ('trim("?!hello?!", "!?")', "hello"),
    ('trimprefix("helloworld", "hello")', "world"), ('trimsuffix("helloworld", "world")', "hello"),
    ('trimspace("  hello\\n\\n")', "hello"), ('upper("hello")', "HELLO"),
    ("alltrue([true, true])", True), ('alltrue(["true", false])', False), ("alltrue([])", True), ("anytrue([])", False),
    ('chunklist(["a", "b", "c", "d", "e"], 2)', [["a", "b"], ["c", "d"], ["e"]]),
    ('coalesce("a", "b")', "a"), ('coalesce("", "b")', "b"), ("coalesce(1, 2)", 1),
    ('coalescelist([], ["c", "d"])', ["c", "d"]), ('compact(["a", "", "b", null, "c"])', ["a", "b", "c"]),
    ('concat(["a", ""], ["b", "c"])', ["a", "", "b", "c"]), ('contains(["a", "b", "c"], "a")', True),
    ('distinct(["a", "b", "a", "c", "d", "b"])', ["a", "b", "c", "d"]), ('element(["a", "b", "c"], 3)', "a"),
    ('flatten([["a", "b"], [], ["c"]])', ["a", "b", "c"]), ('index(["a", "b", "c"], "b")', 1),
    ("keys({a=1, c=2, d=3})", ["a", "c", "d"]), ('length({"a" = "b"})', 1), ('length("hello")', 5),
    ('lookup({a="ay", b="bee"}, "a", "what?")', "ay"), ('lookup({a="ay", b="bee"}, "c", "what?")', "what?"),
    ('matchkeys(["i-123", "i-abc", "i-def"], ["us-west", "us-east", "us-east"], ["us-east"])', ["i-abc", "i-def"]),
    ('merge({a="b", c="d"}, {e="f", c="z"})', {"a": "b", "c": "z", "e": "f"}), ("one([])", None),
    ('one(["hello"])', "hello"), ("range(3)", [0, 1, 2]), ("range(1, 4)", [1, 2, 3]), ("range(1, 8, 2)", [1, 3, 5, 7]),
    ("range(4, 1)", [4, 3, 2]), ("range(0, 1, 0.25)", [0, 0.25, 0.5, 0.75]), ("reverse([1, 2, 3])", [3, 2, 1]),
    ('setintersection(["a", "b"], ["b", "c"], ["b", "d"])', ["b"]),
    ('setproduct(["development", "staging"], ["app1", "app2"])',
     [["development", "app1"], ["development", "app2"], ["staging", "app1"], ["staging", "app2"]]),
    ('setsubtract(["a", "b", "c"], ["a", "c"])', ["b"]), ('setunion(["a", "b"], ["b", "c"], ["d"])', ["a", "b", "c", "d"]),
    ('slice(["a", "b", "c", "d"], 1, 3)', ["b", "c"]), ('sort(["e", "d", "a", "x"])', ["a", "d", "e", "x"]),
    ("sum([10, 13, 6, 4.5])", 33.5),
    ('transpose({"a" = ["1", "2"], "b" = ["2", "3"]})', {"1": ["a"], "2": ["a", "b"], "3": ["b"]}),
    ('values({a=3, c=2, d=1})', [3, 2, 1]), ('zipmap(["a", "b"], [1, 2])', {"a": 1, "b": 2}),
    ('base64decode("SGVsbG8gV29ybGQ=")', "Hello World"), ('base64encode("Hello World")', "SGVsbG8gV29ybGQ="),
    ('csvdecode("a,b,c\\n1,2,3\\n4,5,6")', [{"a": "1", "b": "2", "c": "3"}, {"a": "4", "b": "5", "c": "6"}]),
    ('jsondecode("{\\"hello\\": \\"world\\"}")', {"hello": "world"}), ("jsondecode(\"true\")", True),
    ('jsonencode({"hello"="world"})', '{"hello":"world"}'),
    ('textencodebase64("Hello World", "UTF-16LE")', "SABlAGwAbABvACAAVwBvAHIAbABkAA=="),
    ('textdecodebase64("SABlAGwAbABvACAAVwBvAHIAbABkAA==", "UTF-16LE")', "Hello World"),
    ('urlencode("Hello World!")', "Hello+World%21"), ('urlencode("☃")', "%E2%98%83"),
    ('urlencode("foo:bar@localhost?foo=bar&bar=baz")', "foo%3Abar%40localhost%3Ffoo%3Dbar%26bar%3Dbaz"),
    ('yamldecode("hello: world")', {"hello": "world"}), ('yamldecode("true")', True),
    ('yamldecode("{a: &foo [1, 2, 3], b: *foo}")', {"a": [1, 2, 3], "b": [1, 2, 3]}),
    ('yamlencode({"a":"b", "c":"d"})', '"a": "b"\n"c": "d"\n'),
    ('yamlencode({"foo":[1, 2, 3], "bar": "baz"})', '"bar": "baz"\n"foo":\n- 1\n- 2\n- 3\n'),
    ('yamlencode({"foo":[1, {"a":"b","c":"d"}, 3], "bar": "baz"})',
     '"bar": "baz"\n"foo":\n- 1\n- "a": "b"\n  "c": "d"\n- 3\n'),
    ('basename("foo/bar/baz.txt")', "baz.txt"), ('dirname("foo/bar/baz.txt")', "foo/bar"),
    ('formatdate("DD MMM YYYY hh:mm ZZZ", "2018-01-02T23:12:01Z")', "02 Jan 2018 23:12 UTC"),
    ('formatdate("EEEE, DD-MMM-YY hh:mm:ss ZZZ", "2018-01-02T23:12:01Z")', "Tuesday, 02-Jan-18 23:12:01 UTC"),
    ('formatdate("EEE, DD MMM YYYY hh:mm:ss ZZZ", "2018-01-02T23:12:01-08:00")', "Tue, 02 Jan 2018 23:12:01 -0800"),
    ('formatdate("MMM DD, YYYY", "2018-01-02T23:12:01Z")', "Jan 02, 2018"),
    ('formatdate("HH:mmaa", "2018-01-02T23:12:01Z")', "11:12pm"),
    ('formatdate("h\'h\'mm", "2018-01-02T23:12:01-08:00")', "23h12"),
    ('timeadd("2017-11-22T00:00:00Z", "10m")', "2017-11-22T00:10:00Z"),
    ('timecmp("2017-11-22T00:00:00Z", "2017-11-22T00:00:00Z")', 0),
    ('timecmp("2017-11-22T00:00:00Z", "2017-11-22T01:00:00Z")', -1),
    ('timecmp("2017-11-22T01:00:00Z", "2017-11-22T01:00:00+01:00")', 1),
    ('base64sha256("hello world")', "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek="),
    ('base64sha512("hello world")',
     "MJ7MSJwS1utMxA9QyQLytNDtd+5RGnx6m808qG1M2G+YndNbxf9JlnDaNCVbRbDP2DDoH2Bdz33FVC6TrpzXbw=="),
    ('md5("hello world")', "5eb63bbbe01eeed093cb22bb8f5acdc3"),
    ('sha1("hello world")', "2aae6c35c94fcfb415dbe95f408b9ce91ee846ed"),
    ('sha256("hello world")', "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"),
    ('sha512("hello world")', "309ecc489c12d6eb4cc40f50c902f2b4d0ed77ee511a7c7a9bcd3ca86d4cd86f989dd35bc5ff499670da"
                              "34255b45b0cfd830e81f605dcf7dc5542e93ae9cd76f"),
    ('uuidv5("dns", "www.terraform.io")', "a5008fae-b28c-5ba5-96cd-82b4c53552d6"),
    ('uuidv5("url", "https://www.terraform.io/")', "9db6f67c-dd95-5ea0-aa5b-e70e5c5f7cf5"),
    ('cidrhost("10.12.112.0/20", 16)', "10.12.112.16"), ('cidrhost("10.12.112.0/20", 268)', "10.12.113.12"),
    ('cidrhost("fd00:fd12:3456:7890:00a2::/72", 34)', "fd00:fd12:3456:7890::22"),
    ('cidrnetmask("172.16.0.0/12")', "255.240.0.0"), ('cidrsubnet("172.16.0.0/12", 4, 2)', "172.18.0.0/16"),
    ('cidrsubnet("10.1.2.0/24", 4, 15)', "10.1.2.240/28"),
    ('cidrsubnet("fd00:fd12:3456:7890::/56", 16, 162)', "fd00:fd12:3456:7800:a200::/72"),
    ('cidrsubnets("10.1.0.0/16", 4, 4, 8, 4)', ["10.1.0.0/20", "10.1.16.0/20", "10.1.32.0/24", "10.1.48.0/20"]),
    ('cidrsubnets("fd00:fd12:3456:7890::/56", 16, 16, 16, 32)',
     ["fd00:fd12:3456:7800::/72", "fd00:fd12:3456:7800:100::/72", "fd00:fd12:3456:7800:200::/72",
      "fd00:fd12:3456:7800:300::/88"]),
    ('can(regex("^ami-", "ami-123"))', True), ('can(regex("^ami-", "img-123"))', False),
    ('try(tonumber("x"), "fallback")', "fallback"), ('tobool("true")', True), ("tobool(null)", None),
    ('tolist(["a", "b", "c"])', ["a", "b", "c"]), ('tomap({"a" = 1, "b" = 2})', {"a": 1, "b": 2}),
    ('tonumber("1")', 1), ('tonumber("1.5")', 1.5), ("tonumber(null)", None), ('toset(["c", "b", "b"])', ["b", "c"]),
    ('tostring("hello")', "hello"), ("tostring(1)", "1"), ("tostring(true)", "true"), ("tostring(null)", None),
    ('nonsensitive(sensitive("x"))', "x"), ('issensitive(sensitive("x"))', True), ('issensitive("x")', False),
    ('"${null}"', None), ('"%{ for name in ["a", "b"] ~}\n${name},\n%{ endfor ~}"', "a,\nb,\n"),
    ('"%{ if true }yes%{ else }no%{ endif }"', "yes"),
]


@pytest.mark.parametrize("expression,expected", DOCUMENTED, ids=[e for e, _ in DOCUMENTED])
def test_functions_give_terraforms_documented_results(expression: str, expected: Any) -> None:
    result = evaluate(expression)
    assert result == expected
    assert isinstance(result, bool) == isinstance(expected, bool)  # true is not 1


# idioms of public modules (terraform-aws-modules and the like), with what Terraform gives
IDIOMS = [
    ('lookup({a = 1}, "description", null)', None),
    ('element(concat([], [""]), 0)', ""),
    ("try(m.settings.size, 10)", 10),
    ('coalesce(m.name, "default-name")', "default-name"),
    ('length(compact(["a", "", null]))', 1),
    ('merge(null, {Name = "x"}, m.tags)', {"Name": "x", "env": "dev"}),
    ('one([for k, v in m.tags : v if k == "env"])', "dev"),
    ('sha1(jsonencode({b = 2, a = [1, "x"]}))', hashlib.sha1(b'{"a":[1,"x"],"b":2}').hexdigest()),  # keys sorted
    ('format("%s-%03d", m.tags.env, 7)', "dev-007"),
    ('contains(["dev", "prod"], m.tags.env) ? "known" : "other"', "known"),
]


@pytest.mark.parametrize("expression,expected", IDIOMS, ids=[e for e, _ in IDIOMS])
def test_idioms_of_public_modules(expression: str, expected: Any) -> None:
    assert evaluate(expression, m={"name": None, "tags": {"env": "dev"}}) == expected


# more results, as Terraform 1.11.4's console gives them (JSON-encoded; "ERR": it fails there too)
CONSOLE_RESULTS = [
    ('formatdate("YYYY-MM-DD\'T\'hh:mm:ssZ", "2024-02-29T23:59:59Z")', '"2024-02-29T23:59:59Z"'),
    ('formatdate("EEEE MMMM D", "2024-02-29T01:02:03+01:00")', '"Thursday February 29"'),
    ('formatdate("h:mm AA", "2024-02-29T00:05:00Z")', '"0:05 AM"'),
    ('formatdate("H:mm aa", "2024-02-29T12:05:00Z")', '"12:05 pm"'),
    ('timeadd("2024-02-29T23:59:59Z", "1s")', '"2024-03-01T00:00:00Z"'),
    ('timeadd("2024-01-01T00:00:00Z", "1.5s")', '"2024-01-01T00:00:01Z"'),
    ('timeadd("2024-01-01T00:00:00Z", "-24h")', '"2023-12-31T00:00:00Z"'),
    ('timeadd("2024-01-01T00:00:00.5Z", "1ms")', '"2024-01-01T00:00:00Z"'),
    ('timeadd("2024-01-01T10:00:00+02:00", "1h")', '"2024-01-01T11:00:00+02:00"'),
    ('csvdecode("a,b\\n\\"x,y\\",\\"q\\"\\"r\\"\\n")', '[{"a":"x,y","b":"q\\"r"}]'),
    ('jsondecode("12345678901234567890")', '12345678901234567890'),
    ('jsondecode("{\\"a\\": [1.5, null]}")', '{"a":[1.5,null]}'),
    ('urlencode("ü &=+/")', '"%C3%BC+%26%3D%2B%2F"'),
    ('title("élan vital")', '"Élan Vital"'),
    ('trim("xxhixx", "x")', '"hi"'),
    ('chomp("a\\n\\r\\n")', '"a"'),
    ('split(", ", "a, b,c")', '["a","b,c"]'),
    ('replace("a.b.c", ".", "-")', '"a-b-c"'),
    ('replace("abc", "/[a-b]+/", "X")', '"Xc"'),
    ('replace("aaa", "/a/", "$0")', '"aaa"'),
    ('regexall("(?P<k>[a-z])=(?P<v>\\\\d)", "a=1 b=2")', '[{"k":"a","v":"1"},{"k":"b","v":"2"}]'),
    ('regex("^([a-z]+)-(\\\\d+)$", "web-42")', '["web","42"]'),
    ('cidrsubnets("10.0.0.0/8", 8, 8, 16, 4)', '["10.0.0.0/16","10.1.0.0/16","10.2.0.0/24","10.16.0.0/12"]'),
    ('cidrhost("192.168.1.0/24", 255)', '"192.168.1.255"'),
    ('cidrsubnet("2001:db8::/32", 8, 255)', '"2001:db8:ff00::/40"'),
    ('compact([])', '[]'),
    ('flatten([])', '[]'),
    ('merge()', '{}'),
    ('concat()', 'ERR'),
    ('keys({})', '[]'),
    ('distinct([])', '[]'),
    ('sort([])', '[]'),
    ('reverse([])', '[]'),
    ('zipmap([], [])', '{}'),
    ('transpose({a = []})', '{}'),
    ('chunklist([], 3)', '[]'),
    ('coalescelist([], [1])', '[1]'),
    ('one(toset([]))', 'null'),
    ('length(toset(["a", "a"]))', '1'),
    ('tostring("x")', '"x"'),
    ('tonumber(5)', '5'),
    ('tobool(false)', 'false'),
    ('tomap({})', '{}'),
    ('tolist([])', '[]'),
    ('format("%s %s", "a", "b")', '"a b"'),
    ('format("%[2]s %[1]s", "a", "b")', '"b a"'),
    ('format("%03.1f", 2.25)', '"2.2"'),
    ('format("%+d", 5)', '"+5"'),
    ('format("%8.3f|", -3.14159)', '"  -3.142|"'),
    ('format("%-8s|", "ab")', '"ab      |"'),
    ('format("%x", "hi")', 'ERR'),
    ('format("%q", 5)', '"\\"5\\""'),
    ('format("%v", {a = 1})', '"{\\"a\\":1}"'),
    ('formatlist("%s=%s", ["a", "b"], ["1", "2"])', '["a=1","b=2"]'),
    ('join("", [])', '""'),
    ('join("-", ["a"], [], ["b"])', '"a-b"'),
    ('upper("é")', '"É"'),
    ('substr("hello", 0, 0)', '""'),
    ('substr("hello", -3, 2)', '"ll"'),
    ('substr("", 0, 1)', '""'),
    ('strrev("ab c")', '"c ba"'),
    ('indent(0, "a\\nb")', '"a\\nb"'),
    ('abs(-0.5)', '0.5'),
    ('ceil(1e20)', '100000000000000000000'),
    ('floor(-0.5)', '-1'),
    ('log(1, 10)', '0'),
    ('max(1)', '1'),
    ('min(1.5, 1)', '1'),
    ('parseint("0777", 8)', '511'),
    ('sum([1, 2.5, -1])', '2.5'),
    ('range(-3)', '[0,-1,-2]'),
    ('range(5, 0, -2)', '[5,3,1]'),
    ('range(0.5, 2)', '[0.5,1.5]'),
    ('setproduct(["a"], [])', '[]'),
    ('base64encode("")', '""'),
    ('base64decode("")', '""'),
    ('jsonencode("é\\u2028")', '"\\"é\\\\u2028\\""'),
    ('jsonencode(1e-7)', '"0.0000001"'),
    ('jsonencode(123456789012)', '"123456789012"'),
    ('yamlencode({a = [[], {}], "b c" = null})', '"\\"a\\":\\n- []\\n- {}\\n\\"b c\\": null\\n"'),
    ('yamldecode("- 1\\n- two\\n- 3.5\\n- null\\n- true")', '[1,"two",3.5,null,true]'),
    ('yamldecode("a: 2024-01-01")', '{"a":"2024-01-01T00:00:00Z"}'),
    ('yamldecode("a: 0x10")', '{"a":16}'),
    ('yamldecode("a: yes")', '{"a":true}'),
    ('textencodebase64("é", "UTF-8")', '"w6k="'),
    ('md5("")', '"d41d8cd98f00b204e9800998ecf8427e"'),
    ('sha256("é")', '"4a99557e4033c3539de2eb65472017cad5f9557f7a0625a09f1c3f6e2ba69c4c"'),
    ('uuidv5("6ba7b810-9dad-11d1-80b4-00c04fd430c8", "x")', '"05b16a01-46c6-56dd-bd6e-c6dfb4a1427a"'),
    ('element([1, 2, 3], 5)', '3'),
    ('index(["a", "b", "a"], "a")', '0'),
    ('lookup({a = {b = 1}}, "a")', '{"b":1}'),
    ('contains(["a"], "A")', 'false'),
    ('alltrue([])', 'true'),
    ('matchkeys(["a", "b"], [1, 2], [2])', '["b"]'),
    ('slice([1, 2], 0, 2)', '[1,2]'),
    ('slice([1, 2], 2, 2)', '[]'),
    ('setunion([])', '[]'),
    ('setsubtract([], [1])', '[]'),
    ('setintersection(["a"], [])', '[]'),
    ('startswith("", "")', 'true'),
    ('endswith("abc", "")', 'true'),
    ('strcontains("", "")', 'true'),
    ('trimprefix("aaa", "a")', '"aa"'),
    ('trimsuffix("aaa", "aa")', '"a"'),
    ('trimspace("")', '""'),
    ('lower("ÉÀ")', '"éà"'),
    ('dirname("a/b/")', '"a/b"'),
    ('basename("/")', '"/"'),
    ('abspath("/")', '"/"'),
]


@pytest.mark.parametrize("expression,encoded", CONSOLE_RESULTS, ids=[e for e, _ in CONSOLE_RESULTS])
def test_results_recorded_from_terraforms_console(expression: str, encoded: str) -> None:
    if encoded == "ERR":
        with pytest.raises(ConfigError):
            evaluate(expression)
    else:
        assert json.loads(json.dumps(evaluate(expression))) == json.loads(encoded)


BAD_CALLS = [
    ('format("%s", null)', r'Call to function "format" failed: unsupported value for "%s" at 0: null value cannot '
                           r"be formatted"),
    ('"${null}-"', "Invalid template interpolation value: the expression result is null"),
    ('"a${[1]}"', "cannot include the given value in a string template: string required, got list"),
    ("length(null)", r'Invalid value for "value" parameter of length\(\): argument must not be null'),
    ("upper([1])", r'Invalid value for "str" parameter of upper\(\): string required, got list'),
    ('upper("a", "b")', r'Too many function arguments: function "upper" expects only 1'),
    ("cidrsubnet(\"10.0.0.0/16\")", r'Not enough function arguments: function "cidrsubnet" expects at least 3 '
                                    r'argument\(s\). Missing value for "newbits"'),
    ('tonumber("ten")', r'cannot convert "ten" to number'),
    ('element([], 0)', "cannot use element function with an empty list"),
    ('regex("^x", "abc")', "pattern did not match any part of the given string"),
    ('lookup({a = 1}, "b")', 'lookup failed to find key "b"'),
    ('sum([])', "cannot sum an empty list"),
    ('cidrsubnet("10.0.0.0/30", 4, 0)', "insufficient address space to extend prefix of 30 by 4"),
    ("one([1, 2])", "must be a list, set, or tuple value with either zero or one elements"),
    ("type(1)", "function `type` is not available in the sandbox: Terraform offers it only in `terraform console`"),
    ("nofunc(1)", "function `nofunc` is not available: Terraform has no function of that name"),
    ('provider::aws::arn_parse("x")', "provider-defined function `provider::aws::arn_parse` is not available"),
    ("timeadd(\"2017-11-22T00:00:00Z\", \"10 minutes\")", r'time: invalid duration "10 minutes"'),
]


@pytest.mark.parametrize("expression,message", BAD_CALLS)
def test_bad_calls_fail_as_terraform_does_naming_file_and_line(expression: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^test: on test\.tf line 1: .*" + message):
        evaluate(expression)


OPERATIONS = [
    ('"5" + 1', 6), ("4 / 2", 2), ("10 / 4", 2.5), ("0.1 + 0.2", 0.3), ("-5 % 3", -2), ('-"3"', -3),
    ("1 == true", False), ('"1" == 1', False), ('[1, "a"] == [1, "a"]', True), ('"true" ? "yes" : "no"', "yes"),
    ('"${5}"', 5), ('"n=${5 / 2}"', "n=2.5"), ('"${true}!"', "true!"), ("5 % 0", 5), ("1e20", 10**20),
    ('{(true) = 1, (2) = "b"}', {"true": 1, "2": "b"}), ("[for k, v in {b = 2, a = 1} : k]", ["a", "b"]), ("{for x in [1, 2.5] : x => x * 2}", {"1": 2, "2.5": 5}),
]


@pytest.mark.parametrize("expression,expected", OPERATIONS)
def test_operators_follow_terraforms_types(expression: str, expected: Any) -> None:
    result = evaluate(expression)
    assert result == expected
    assert isinstance(result, bool) == isinstance(expected, bool)


BAD_OPERATIONS = [
    ('"a" + 1', r'Invalid operand: unsuitable value for left operand: cannot convert "a" to number'),
    ("null + 1", "Invalid operand: unsuitable value for left operand: a number is required, got null"),
    ("0 / 0", "can't divide zero by zero"),
    ('true && "x"', r'unsuitable value for right operand: cannot convert "x" to bool'),
    ("null ? 1 : 2", "Null condition: the condition value is null"),
    ("5 ? 1 : 2", "Incorrect condition type: the condition expression must be of type bool, got number"),
    ("[for x in null : x]", "Iteration over null value: a null value cannot be used as the collection"),
    ('"%{ if null }x%{ endif }"', "Invalid template directive: the condition must be a bool, got null"),
    ('{for x in ["a", "a"] : x => 1}', 'duplicate key "a" in a for expression; use `...`'),
    ("{(null) = 1}", "Invalid object key: the key expression produced null"),
    ("[1, 2][-1]", r"Invalid index: the given key \(-1\) does not identify an element"),
    ("null.x", "Attempt to get attribute `x` from null value"),
    ("null[0]", "Attempt to index null value"),
    ("{a = 1}.b", "Unsupported attribute: this object does not have an attribute named `b`"),
    ("false && null", "unsuitable value for right operand: bool required, got null"),  # no short circuit
]


@pytest.mark.parametrize("expression,message", BAD_OPERATIONS)
def test_operator_errors_are_terraforms_naming_file_and_line(expression: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^test: on test\.tf line 1: .*" + message):
        evaluate(expression)


def test_heredocs_and_templates_keep_quotes_inside_interpolations() -> None:
    heredoc = '<<EOT\n{"a": "${jsonencode({"k" = "v"})}", "b": "back\\slash"}\n%{ for n in ["p", "q"] ~}\n- ${n}\n' \
              '%{ endfor ~}\nEOT\n'
    assert evaluate(heredoc) == '{"a": "{"k":"v"}", "b": "back\\slash"}\n- p\n- q\n'


@pytest.mark.parametrize("expression,message", [
    ('indent(100000000, "a\\nb")', r"indenting by 100000000 would add more than the sandbox builds"),
    ('format("%999999999d", 1)', r"a width of 999999999 is more than the sandbox pads"),
    ("setproduct(range(100), range(100), range(100))", r"the product would have 1000000 elements"),
])
def test_calls_that_would_exhaust_the_gateway_are_refused_clearly(expression: str, message: str) -> None:
    # Terraform would try; a gateway that plans for many teams must not build a gigabyte string for one
    with pytest.raises(ConfigError, match=r"^test: on test\.tf line 1: .*" + message):
        evaluate(expression)
    assert evaluate("pow(10, 400)") == float("inf")  # floating point as Terraform's, not a 401-digit integer


def test_unknown_values_propagate_except_where_terraform_knows_better() -> None:
    assert evaluate("upper(x)", x=UNKNOWN) is UNKNOWN
    assert evaluate('join(",", ["a", x])', x=UNKNOWN) is UNKNOWN
    assert evaluate('length(["a", x])', x=UNKNOWN) == 2  # the list is known, one element is not
    assert evaluate('concat(["a"], [x])', x=UNKNOWN) == ["a", UNKNOWN]
    assert evaluate('flatten([[{a = x}], [{a = 1}]])', x=UNKNOWN) == [{"a": UNKNOWN}, {"a": 1}]  # known: two objects
    assert evaluate('flatten([["a"], x])', x=UNKNOWN) is UNKNOWN  # x may be a list: how many elements is not known
    assert evaluate("keys({a = x, b = 1})", x=UNKNOWN) == ["a", "b"]
    assert evaluate('lookup({a = x, b = "bee"}, "b")', x=UNKNOWN) == "bee"
    assert evaluate("length(x)", x=UNKNOWN) is UNKNOWN
    assert evaluate('try(x, "fallback")', x=UNKNOWN) is UNKNOWN  # whether x fails is not known yet
    assert evaluate("can(x)", x=UNKNOWN) is UNKNOWN
    assert evaluate('"id-${x}"', x=UNKNOWN) is UNKNOWN
    assert evaluate("timestamp()") is UNKNOWN and evaluate("uuid()") is UNKNOWN and evaluate("plantimestamp()") is UNKNOWN
    assert evaluate("[for s in x : upper(s)]", x=UNKNOWN) is UNKNOWN
    assert evaluate('[for s in ["a", "b"] : s if s == x]', x=UNKNOWN) is UNKNOWN
    assert evaluate('"%{ for s in x }${s}%{ endfor }"', x=UNKNOWN) is UNKNOWN
    assert evaluate('x ? "a" : "b"', x=UNKNOWN) is UNKNOWN
    assert evaluate('false && x == "a"', x=UNKNOWN) is UNKNOWN  # as terraform console says


def test_sensitive_arguments_make_sensitive_results_and_quiet_errors() -> None:
    assert evaluate("md5(pw)", pw=Sensitive("hunter2")) == Sensitive(hashlib.md5(b"hunter2").hexdigest())
    assert evaluate('merge({a = 1}, {b = pw})', pw=Secret("s")) == Secret({"a": 1, "b": "s"})
    assert evaluate("nonsensitive(md5(pw))", pw=Secret("s")) == Secret(hashlib.md5(b"s").hexdigest())
    with pytest.raises(ConfigError) as caught:
        evaluate("tonumber(pw)", pw=Secret("hunter2"))
    assert "hunter2" not in str(caught.value) and "the value is sensitive" in str(caught.value)
    # which fallback try() picks tells whether the secret was null: the answer is as secret as the secret
    assert evaluate('try(upper(pw), "none")', pw=Secret(None)) == Secret("none")
    assert evaluate("can(upper(pw))", pw=Secret(None)) == Secret(False)


def _terraform_console() -> str | None:
    """A Terraform on PATH recent enough for every function the examples call (1.5: strcontains), else None."""
    binary = shutil.which("terraform")
    if binary is None:
        return None
    out = subprocess.run([binary, "version", "-json"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TF_CLI_CONFIG_FILE": os.devnull})
    version = tuple(int(p) for p in json.loads(out.stdout)["terraform_version"].split("-")[0].split(".")[:2])
    return binary if version >= (1, 5) else None


# the examples that need names in scope, marks, or Terraform's typed nulls are checked above, not here
_DIFFERENTIAL = [e for e, _ in DOCUMENTED if "sensitive" not in e and "\n" not in e and e != '"${null}"'] \
    + [e for e, _ in IDIOMS if "m." not in e] + [e for e, _ in OPERATIONS]
# in the console a bare `null` has no type, so format("%s", null) is unknown there; `type` is the console's own
_FAILING = [e for e, _ in BAD_CALLS + BAD_OPERATIONS if e not in ('format("%s", null)', "type(1)")]


@pytest.mark.skipif(_terraform_console() is None, reason="no Terraform >= 1.5 on PATH to compare against")
def test_the_same_expressions_give_the_same_values_in_real_terraform(tmp_path: Path) -> None:
    binary = _terraform_console()
    assert binary is not None
    # one console run for all: each value comes back JSON-encoded (Terraform's console prints only the last line)
    expression = "jsonencode([" + ", ".join([f"jsonencode({e})" for e in _DIFFERENTIAL]
                                            + [f"jsonencode(can({e}))" for e in _FAILING]) + "])\n"
    out = subprocess.run([binary, "console"], input=expression, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env={**os.environ, "TF_CLI_CONFIG_FILE": os.devnull})
    assert out.returncode == 0, out.stderr
    terraform = [json.loads(v) for v in json.loads(json.loads(out.stdout))]
    sandbox = [json.loads(json.dumps(evaluate(e))) for e in _DIFFERENTIAL] + [False] * len(_FAILING)
    differences = [(e, t, s) for e, t, s in zip(_DIFFERENTIAL + _FAILING, terraform, sandbox, strict=True) if t != s]
    assert not differences  # values as Terraform's, and what fails here fails in Terraform too


# --- through the engine, on stacks in temp dirs ------------------------------------------------


@pytest.fixture
def engine() -> SandboxEngine:
    """The engine over its store in memory: what it plans from the files in a folder, no database."""
    return SandboxEngine(FakeSandboxStore())


def write_stack(root: Path, files: dict[str, str | bytes]) -> Path:
    stack = root / "checkout" / "web"
    for name, content in files.items():
        target = stack / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    return stack


def after(plan: EnginePlan, address: str) -> dict[str, Any]:
    change = next(c for c in plan.document["resource_changes"] if c["address"] == address)
    return change["change"]


TEMPLATE = """\
#!/bin/bash
echo "${greeting}" > /etc/motd
%{ for port in ports ~}
open ${port}
%{ endfor ~}
%{ if debug }set -x%{ endif }
"""


def test_file_functions_read_beside_the_stack(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write_stack(tmp_path, {
        "main.tf": '''
resource "aws_ssm_parameter" "p" {
  name        = "motd"
  value       = templatefile("${path.module}/templates/init.sh.tpl", { greeting = "hi", ports = [80, 443], debug = false })
  description = trimspace(file("${path.module}/VERSION"))
  tags = {
    files   = jsonencode(fileset(path.module, "templates/*.tpl"))
    md5     = filemd5("VERSION")
    b64     = filebase64("logo.bin")
    exists  = fileexists("${path.module}/missing.txt")
    where   = abspath(path.module)
    sha     = filebase64sha256("VERSION")
  }
}
''',
        "VERSION": "1.4.2\n",
        "logo.bin": b"\x89PNG\x00\xff",
        "templates/init.sh.tpl": TEMPLATE,
        "templates/other.txt": "not a template",
    })
    change = after(engine.plan("web", stack, StackInputs()), "aws_ssm_parameter.p")
    assert change["after"]["value"] == '#!/bin/bash\necho "hi" > /etc/motd\nopen 80\nopen 443\n\n'
    assert change["after"]["description"] == "1.4.2"
    tags = change["after"]["tags"]
    assert json.loads(tags["files"]) == ["templates/init.sh.tpl"]
    assert tags["md5"] == hashlib.md5(b"1.4.2\n").hexdigest()
    assert tags["b64"] == "iVBORwD/"
    assert tags["exists"] is False
    assert tags["where"] == "/checkout"  # never the temp dir the plan ran in
    assert tags["sha"] == base64.b64encode(hashlib.sha256(b"1.4.2\n").digest()).decode()


@pytest.mark.parametrize("path,shown", [
    ("../../secrets.env", '"../../secrets.env" is outside the stack directory web'),
    ("/etc/passwd", '"/etc/passwd" is outside the stack directory web'),
    ("~/.aws/credentials", '"~/.aws/credentials" is outside the stack directory web'),
    ("link/secrets.env", '"link/secrets.env" is outside the stack directory web'),
])
def test_file_functions_refuse_paths_outside_the_checkout(engine: SandboxEngine, tmp_path: Path, path: str,
                                                          shown: str) -> None:
    stack = write_stack(tmp_path, {"main.tf": f'''
resource "aws_ssm_parameter" "p" {{
  name  = "leak"
  value = file("{path}")
}}
'''})
    (tmp_path / "secrets.env").write_text("AWS_SECRET=hunter2\n")
    (stack / "link").symlink_to(tmp_path)
    with pytest.raises(ConfigError) as caught:
        engine.plan("web", stack, StackInputs())
    message = str(caught.value)
    assert shown in message and "web/main.tf:4: aws_ssm_parameter.p:" in message
    assert "hunter2" not in message


def test_null_and_type_errors_name_the_file_and_line(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write_stack(tmp_path, {"variables.tf": 'variable "suffix" {\n  default = null\n}\n', "main.tf": '''
resource "aws_s3_bucket" "a" {
  bucket = "orders"
}

resource "aws_s3_bucket" "b" {
  bucket = format("orders-%s", var.suffix)
}
'''})
    with pytest.raises(ConfigError, match=r"stack web: web/main\.tf:7: aws_s3_bucket\.b: Call to function "
                                          r'"format" failed: unsupported value for "%s" at 7: null value'):
        engine.plan("web", stack, StackInputs())
    (stack / "main.tf").write_text('resource "aws_s3_bucket" "b" {\n  bucket = "orders-${var.suffix}"\n}\n')
    with pytest.raises(ConfigError, match=r"web/main\.tf:2: aws_s3_bucket\.b: Invalid template interpolation value: the "
                                          r"expression result is null"):
        engine.plan("web", stack, StackInputs())
    (stack / "main.tf").write_text('resource "aws_s3_bucket" "b" {\n  bucket = "orders"\n  tags = {\n'
                                   '    n = substr("orders", "one", 2)\n  }\n}\n')
    with pytest.raises(ConfigError, match=r'web/main\.tf:4: aws_s3_bucket\.b: Invalid value for "offset" parameter of '
                                          r'substr\(\): cannot convert "one" to number'):
        engine.plan("web", stack, StackInputs())


def test_a_broken_template_names_its_file_and_line(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write_stack(tmp_path, {"main.tf": '''
resource "aws_ssm_parameter" "p" {
  name  = "motd"
  value = templatefile("motd.tpl", { who = "ops" })
}
''', "motd.tpl": "Hello ${who}\nSee ${ oops\n"})
    with pytest.raises(ConfigError, match=r"on motd\.tpl line 2: invalid template syntax: an interpolation or "
                                          r"directive is not closed"):
        engine.plan("web", stack, StackInputs())


# templates with strip markers, and what Terraform 1.11.4's templatefile() made of them: a `~` trims only the
# line next to it (and that line's break, after it), not every blank line around
STRIPPED_TEMPLATES = [
    ("A \n \n ${~ 1 ~} \n \n B", "A \n \n1 \n B"),
    ("A \n \n %{~ if true ~} \n \n B%{ endif }", "A \n \n \n B"),
    ("A \n \n ${~ 1} B", "A \n \n1 B"),
    ("A ${1 ~} \n \n B", "A 1 \n B"),
    ("a\n  ${~ x ~}  \n  b\n${y}\n", "a\nX  b\nY\n"),
    ('h ${~ "k"}\n  ${"m" ~}\n  end \\\\ "q"\n', 'hk\n  m  end \\\\ "q"\n'),
]


@pytest.mark.parametrize("template,rendered", STRIPPED_TEMPLATES)
def test_strip_markers_trim_as_terraform_does(engine: SandboxEngine, tmp_path: Path, template: str,
                                              rendered: str) -> None:
    stack = write_stack(tmp_path, {"main.tf": '''
resource "aws_ssm_parameter" "p" {
  name  = "t"
  value = templatefile("t.tpl", { x = "X", y = "Y" })
}
''', "t.tpl": template})
    assert after(engine.plan("web", stack, StackInputs()), "aws_ssm_parameter.p")["after"]["value"] == rendered


def test_a_template_cannot_render_templates(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write_stack(tmp_path, {"main.tf": '''
resource "aws_ssm_parameter" "p" {
  name  = "loop"
  value = templatefile("loop.tpl", {})
}
''', "loop.tpl": 'again: ${templatefile("loop.tpl", {})}\n'})
    with pytest.raises(ConfigError, match=r"on loop\.tpl line 1: .*cannot recursively call templatefile"):
        engine.plan("web", stack, StackInputs())


def test_errors_inside_templates_and_heredocs_name_their_own_lines(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write_stack(tmp_path, {"main.tf": '''
resource "aws_ssm_parameter" "p" {
  name  = "init"
  value = templatefile("init.tpl", { greeting = "hi" })
}
''', "init.tpl": "#!/bin/bash\necho ${greeting}\necho ${nickname}\n"})
    with pytest.raises(ConfigError, match=r"aws_ssm_parameter\.p: on init\.tpl line 3: unknown name `nickname`"):
        engine.plan("web", stack, StackInputs())
    (stack / "main.tf").write_text('''resource "aws_ssm_parameter" "p" {
  name  = "init"
  value = <<-EOT
    #!/bin/bash
    echo ${format("%s", null)}
  EOT
}
''')
    with pytest.raises(ConfigError, match=r"web/main\.tf:5: aws_ssm_parameter\.p: Call to function \"format\" failed"):
        engine.plan("web", stack, StackInputs())


def test_unknown_until_apply_then_known(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write_stack(tmp_path, {"main.tf": '''
resource "aws_s3_bucket" "logs" {
  bucket = "orders-logs"
}

resource "aws_ssm_parameter" "p" {
  name  = "build"
  value = uuid()
  tags = {
    created = timestamp()
    day     = formatdate("YYYY-MM-DD", "2024-03-05T10:00:00Z")
    refs    = length([aws_s3_bucket.logs.arn, "x"])
    arn     = upper(aws_s3_bucket.logs.arn)
  }
}
'''})
    plan = engine.plan("web", stack, StackInputs())
    change = after(plan, "aws_ssm_parameter.p")
    assert change["after_unknown"]["value"] is True
    assert change["after_unknown"]["tags"]["created"] is True and change["after_unknown"]["tags"]["arn"] is True
    assert change["after"]["tags"]["day"] == "2024-03-05"
    assert change["after"]["tags"]["refs"] == 2  # known: the list's length does not wait for the arn
    outcome = engine.apply("web", stack, plan.document, plan.state_serial, StackInputs())
    assert outcome.succeeded, outcome.error
    state = engine.store.read_state("web")
    assert state is not None
    applied = state.resources["aws_ssm_parameter.p"].attributes
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", applied["value"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", applied["tags"]["created"])
    assert applied["tags"]["arn"] == "ARN:AWS:S3:::ORDERS-LOGS"
    replan = engine.plan("web", stack, StackInputs())
    assert after(replan, "aws_ssm_parameter.p")["actions"] == ["update"]  # as in Terraform: timestamp() changes


def test_a_sensitive_input_stays_masked_through_functions(engine: SandboxEngine, tmp_path: Path) -> None:
    stack = write_stack(tmp_path, {"main.tf": '''
variable "db_password" {
  type = string
}

output "digest" {
  value     = sha256(var.db_password)
  sensitive = true
}

output "length" {
  value = nonsensitive(length(var.db_password))
}
'''})
    plan = engine.plan("web", stack, StackInputs(values={"db_password": "hunter2"}))
    outputs = plan.document["output_changes"]
    assert outputs["digest"]["after_sensitive"] is True
    assert outputs["length"]["after_sensitive"] is True  # a workspace secret stays masked even through nonsensitive()
    assert "hunter2" not in json.dumps(plan.document)


def test_templatefile_in_a_real_checkout_through_plan_stack(workspace: Workspace, clone: Clone) -> None:
    clone.branch("motd").write("stacks/app-staging/motd.tpl", "Welcome to ${upper(env)}%{ if admin } (admin)%{ endif }\n")
    clone.write("stacks/app-staging/motd.tf", '''
resource "aws_ssm_parameter" "motd" {
  name  = "motd-${local.env}"
  value = templatefile("${path.module}/motd.tpl", { env = local.env, admin = true })
  tags  = merge(local.tags, { digest = substr(md5(file("${path.module}/motd.tpl")), 0, 8) })
}
''').push()
    result = plan_stack(workspace, "app-staging", "motd")
    change = result.plan.find("aws_ssm_parameter.motd")
    assert change is not None and change.kind == ChangeKind.CREATE
    assert change.change.after["value"] == "Welcome to STAGING (admin)\n"
    assert len(change.change.after["tags"]["digest"]) == 8


# --- the documentation table -------------------------------------------------------------------


def test_the_documentation_table_matches_the_code() -> None:
    rows = re.findall(r"^\| `([a-z0-9]+)` \| [a-z ]+ \| (yes|no) \|", DOC.read_text(), re.MULTILINE)
    documented = [name for name, _ in rows]
    assert sorted(documented) == documented_names(), "docs/SANDBOX_FUNCTIONS.md lists other functions than Terraform's"
    assert sorted(n for n, yes in rows if yes == "yes") == supported_names()
    assert set(supported_names()) <= set(documented_names())
