#!/usr/bin/env python3
"""Check Agent Skills folders against the rules skillhost's loader applies.

Usage:
    python3 validate_skill.py [--strict] [--builtin-parser] SKILL_DIR [SKILL_DIR ...]

Each SKILL_DIR is a skill folder (the one holding SKILL.md); a path to a
SKILL.md file is accepted too and means its folder. For every folder the
script prints one line per problem,

    ERROR: <folder>: <sentence>      the skill breaks a rule and must be fixed
    WARNING: <folder>: <sentence>    the skill loads, but something is off

followed by `OK: <folder>` when the folder passes: no errors, and with
--strict no warnings either. The exit status is 0 when every folder passes,
1 when any does not, and 2 for a usage mistake.

Only the Python 3 standard library is needed. When PyYAML is installed it
reads the frontmatter; otherwise (or with --builtin-parser) a small built-in
reader handles what SKILL.md frontmatter uses in practice: `key: value`
pairs, quoted strings, `>` and `|` block scalars, nested mappings such as
`metadata:`, and lists such as `allowed-tools:`.
"""

import argparse
import os
import re
import stat
import sys
import urllib.parse

# Limits, matching skillhost's loader and the Agent Skills specification.
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_COMPATIBILITY_CHARS = 500
MAX_SKILL_MD_BYTES = 4 * 1024 * 1024
MAX_SKILL_FILES = 4096
MAX_SKILL_BYTES = 256 * 1024 * 1024
# The specification recommends keeping SKILL.md under this many lines.
RECOMMENDED_MAX_LINES = 500
# Shorter than this, a description rarely says both what and when.
SHORT_DESCRIPTION_CHARS = 40

# The keys the Agent Skills specification defines, then the keys Claude
# Code's SKILL.md adds, which skillhost's loader reads too.
SPEC_KEYS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
EXTENSION_KEYS = ("disable-model-invocation", "user-invocable", "argument-hint", "model")
KNOWN_KEYS = SPEC_KEYS + EXTENSION_KEYS
# skillhost shows at most this many characters of an argument hint.
MAX_ARGUMENT_HINT_CHARS = 200
# Folder and file names the loader never scans or indexes.
SKIPPED_NAMES = (".git", "node_modules", "__pycache__")
# Folders whose paths in the body are always treated as file references.
CONVENTIONAL_DIRS = ("scripts", "references", "reference", "assets", "templates", "examples", "agents", "docs")

NAME_PATTERN = re.compile(r"[a-z0-9-]+")


class FrontmatterError(Exception):
    """The frontmatter cannot be read as YAML; the message is one sentence."""


def one_line(text):
    """Collapses any whitespace run, newlines included, into one space."""
    return " ".join(str(text).split())


# --------------------------------------------------------------------------
# Reading the frontmatter with PyYAML, when it is installed.
# --------------------------------------------------------------------------

def make_pyyaml_reader():
    """Returns a function text -> value using PyYAML, or None without it.

    The loader refuses duplicate keys (PyYAML keeps the last one silently)
    and resolves scalars the way YAML 1.2 does, as skillhost's Rust loader
    does: only true/false are booleans, and dates stay text.
    """
    try:
        import yaml
    except ImportError:
        return None

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                self.flatten_mapping(node)
                seen = set()
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        duplicate = key in seen
                    except TypeError:
                        raise yaml.constructor.ConstructorError(
                            None, None, "a key is a list or mapping, which is not allowed", key_node.start_mark
                        )
                    if duplicate:
                        raise yaml.constructor.ConstructorError(
                            None, None, "the key '%s' appears twice" % key, key_node.start_mark
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    # YAML 1.1 treats yes/no/on/off as booleans and 2024-01-01 as a date;
    # YAML 1.2 (and so skillhost) reads them as text.
    resolvers = {}
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
        kept = [(tag, rx) for tag, rx in entries
                if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")]
        if kept:
            resolvers[first] = kept
    StrictLoader.yaml_implicit_resolvers = resolvers
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )

    def read(text):
        try:
            return yaml.load(text, Loader=StrictLoader)
        except yaml.MarkedYAMLError as err:
            # Rebuilt from its parts: str(err) quotes the offending line over
            # several lines. PyYAML counts from 0 within the frontmatter, and
            # SKILL.md's first line is the opening '---'.
            what = "; ".join(one_line(p) for p in (err.context, err.problem) if p)
            mark = err.problem_mark or err.context_mark
            message = what or "the frontmatter cannot be parsed"
            if mark is not None:
                message += " (SKILL.md line %d, column %d)" % (mark.line + 2, mark.column + 1)
            raise FrontmatterError(message)
        except yaml.YAMLError as err:
            message = one_line(err)
            raise FrontmatterError(message)

    return read


# --------------------------------------------------------------------------
# The built-in reader, for machines without PyYAML.
# --------------------------------------------------------------------------

class BuiltinYaml:
    """Reads the block-style YAML subset SKILL.md frontmatter uses.

    Anything outside that subset (anchors, tags, complex keys, mappings
    inside lists) is refused with a sentence that suggests installing
    PyYAML, never guessed at.
    """

    def __init__(self, text):
        self.lines = text.splitlines()

    # ----- helpers -------------------------------------------------------

    def fail(self, index, message):
        raise FrontmatterError("%s (SKILL.md line %d)" % (message, index + 2))

    @staticmethod
    def indent_of(line):
        return len(line) - len(line.lstrip(" "))

    @staticmethod
    def is_blank(line):
        stripped = line.strip()
        return not stripped or stripped.startswith("#")

    def next_content(self, index):
        """Index of the next line that is not blank or a comment, or None."""
        while index < len(self.lines):
            if not self.is_blank(self.lines[index]):
                return index
            index += 1
        return None

    def check_tabs(self, index):
        line = self.lines[index]
        if "\t" in line[: len(line) - len(line.lstrip(" \t"))]:
            self.fail(index, "it is indented with a tab; YAML allows only spaces for indentation")

    @staticmethod
    def strip_comment(text):
        """Removes a trailing ' # comment' from unquoted text."""
        match = re.search(r"(^|\s)#", text)
        return text[: match.start()].rstrip() if match else text.rstrip()

    @staticmethod
    def resolve_plain(text):
        """Types a plain scalar the way YAML 1.2's core schema does."""
        if text in ("", "~", "null", "Null", "NULL"):
            return None
        if text in ("true", "True", "TRUE"):
            return True
        if text in ("false", "False", "FALSE"):
            return False
        if re.fullmatch(r"[-+]?[0-9]+", text):
            return int(text)
        if re.fullmatch(r"0o[0-7]+", text):
            return int(text[2:], 8)
        if re.fullmatch(r"0x[0-9a-fA-F]+", text):
            return int(text[2:], 16)
        if re.fullmatch(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?", text):
            return float(text)
        if re.fullmatch(r"[-+]?\.(inf|Inf|INF)", text):
            return float("-inf") if text.startswith("-") else float("inf")
        if text in (".nan", ".NaN", ".NAN"):
            return float("nan")
        return text

    def unquote(self, index, text):
        """Reads a quoted scalar at the start of `text`; returns (value, rest)."""
        quote = text[0]
        out = []
        i = 1
        while i < len(text):
            c = text[i]
            if quote == "'":
                if c == "'":
                    if text[i + 1: i + 2] == "'":
                        out.append("'")
                        i += 2
                        continue
                    return "".join(out), text[i + 1:]
                out.append(c)
                i += 1
                continue
            if c == '"':
                return "".join(out), text[i + 1:]
            if c == "\\":
                code = text[i + 1: i + 2]
                simple = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", '"': '"', "\\": "\\",
                          "/": "/", " ": " ", "e": "\x1b", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
                if code in simple:
                    out.append(simple[code])
                    i += 2
                    continue
                widths = {"x": 2, "u": 4, "U": 8}
                if code in widths:
                    digits = text[i + 2: i + 2 + widths[code]]
                    if len(digits) == widths[code] and re.fullmatch(r"[0-9a-fA-F]+", digits):
                        out.append(chr(int(digits, 16)))
                        i += 2 + widths[code]
                        continue
                self.fail(index, "the quoted text has an unknown escape '\\%s'" % code)
            out.append(c)
            i += 1
        self.fail(index, "a quoted value is not closed by its %s" % ("single quote" if quote == "'" else "double quote"))

    def gather_quoted(self, index, first, indent):
        """Reads a quoted scalar that may continue on more-indented lines."""
        parts = [first]
        end = index + 1
        while True:
            folded = parts[0]
            for part in parts[1:]:
                # A line break inside quotes folds to a space; a blank line is a newline.
                if part == "":
                    folded += "\n"
                elif folded.endswith("\n"):
                    folded += part
                else:
                    folded += " " + part
            try:
                return self.unquote_checked(index, folded), end
            except FrontmatterError:
                more = end < len(self.lines) and (
                    not self.lines[end].strip() or self.indent_of(self.lines[end]) > indent)
                if not more:
                    raise
                parts.append(self.lines[end].strip())
                end += 1

    def unquote_checked(self, index, text):
        value, rest = self.unquote(index, text)
        rest = rest.strip()
        if rest and not rest.startswith("#"):
            self.fail(index, "there is text after the closing quote: '%s'" % rest)
        return value

    def split_flow(self, index, inner):
        """Splits the inside of [..] or {..} at top-level commas."""
        parts, current, quote = [], [], None
        for c in inner:
            if quote:
                current.append(c)
                if c == quote:
                    quote = None
                continue
            if c in "'\"":
                quote = c
                current.append(c)
            elif c in "[]{}":
                self.fail(index, "nested [ ] or { } collections are beyond the built-in reader; install PyYAML")
            elif c == ",":
                parts.append("".join(current).strip())
                current = []
            else:
                current.append(c)
        if quote:
            self.fail(index, "a quoted value inside [ ] or { } is not closed")
        tail = "".join(current).strip()
        if tail:
            parts.append(tail)
        elif parts:
            pass  # a trailing comma is allowed
        return [p for p in parts if p != ""] if parts else []

    def flow_scalar(self, index, text):
        if text[:1] in ("'", '"'):
            return self.unquote_checked(index, text)
        return self.resolve_plain(text)

    def parse_flow(self, index, text):
        opener, closer = text[0], "]" if text[0] == "[" else "}"
        body = self.strip_comment(text) if not re.search(r"['\"]", text) else text.rstrip()
        if not body.endswith(closer):
            self.fail(index, "a '%s' collection is not closed by '%s' on the same line" % (opener, closer))
        parts = self.split_flow(index, body[1:-1])
        if opener == "[":
            return [self.flow_scalar(index, p) for p in parts]
        mapping = {}
        for part in parts:
            key_text, sep, value_text = part.partition(":")
            if not sep:
                self.fail(index, "'%s' inside { } is not a 'key: value' pair" % part)
            key = self.flow_scalar(index, key_text.strip())
            if key in mapping:
                self.fail(index, "the key '%s' appears twice" % key)
            mapping[key] = self.flow_scalar(index, value_text.strip())
        return mapping

    # ----- block structure ----------------------------------------------

    def split_key(self, index, content):
        """Splits 'key: rest' into (key, rest)."""
        if content[:1] in ("'", '"'):
            key, rest = self.unquote(index, content)
            if not rest.startswith(":") or (len(rest) > 1 and rest[1] not in " \t"):
                self.fail(index, "a quoted key is not followed by ': '")
            return key, rest[1:]
        if content[:1] in ("?", "&", "*", "!", "[", "{", "|", ">", "@", "`", "%"):
            self.fail(index, "'%s' starts with '%s', which the built-in reader does not accept here; install PyYAML"
                      % (content.strip(), content[0]))
        match = re.match(r"([^#]*?):(\s|$)", content)
        if not match or not match.group(1).strip():
            self.fail(index, "'%s' is not a 'key: value' pair" % content.strip())
        return self.resolve_key(match.group(1).strip()), content[match.end(1) + 1:]

    def resolve_key(self, text):
        value = self.resolve_plain(text)
        return text if value is None else value

    def parse_block(self, index, indent):
        """Parses the mapping or list whose first line is `index`, at `indent`."""
        content = self.lines[index][indent:]
        if content == "-" or content.startswith("- "):
            return self.parse_sequence(index, indent)
        return self.parse_mapping(index, indent)

    def parse_mapping(self, index, indent):
        result = {}
        while True:
            index = self.next_content(index)
            if index is None:
                return result, len(self.lines)
            self.check_tabs(index)
            line = self.lines[index]
            line_indent = self.indent_of(line)
            if line_indent < indent:
                return result, index
            if line_indent > indent:
                self.fail(index, "it is indented more than the key before it, which YAML does not allow here")
            content = line[indent:]
            if content == "-" or content.startswith("- "):
                self.fail(index, "a list item appears where a 'key: value' pair was expected")
            key, rest = self.split_key(index, content)
            if key in result:
                self.fail(index, "the key '%s' appears twice" % key)
            value, index = self.parse_value(index, rest, indent, allow_indentless=True)
            result[key] = value

    def parse_sequence(self, index, indent):
        items = []
        while True:
            index = self.next_content(index)
            if index is None:
                return items, len(self.lines)
            self.check_tabs(index)
            line = self.lines[index]
            line_indent = self.indent_of(line)
            if line_indent < indent:
                return items, index
            content = line[indent:]
            if line_indent > indent or not (content == "-" or content.startswith("- ")):
                if line_indent == indent:
                    return items, index
                self.fail(index, "it does not line up with the list items above it")
            rest = content[1:]
            if re.match(r"\s*[^'\"\[{#][^#]*?:(\s|$)", rest):
                self.fail(index, "a list item holds a 'key: value' mapping, which is beyond the built-in reader; "
                                 "install PyYAML")
            value, index = self.parse_value(index, rest, indent, allow_indentless=False)
            items.append(value)

    def parse_value(self, index, rest, indent, allow_indentless):
        """Parses what follows 'key:' or '- ' on line `index`; returns (value, next index)."""
        text = rest.strip()
        if text[:1] in ("|", ">"):
            return self.parse_block_scalar(index, text, indent)
        if text[:1] in ("'", '"'):
            return self.gather_quoted(index, text, indent)
        if text[:1] in ("[", "{"):
            return self.parse_flow(index, text), index + 1
        if text[:1] in ("&", "*", "!"):
            self.fail(index, "YAML anchors, aliases and tags are beyond the built-in reader; install PyYAML")
        if text[:1] in ("@", "`", "%"):
            self.fail(index, "a value may not start with '%s' unless it is quoted" % text[0])
        text = self.strip_comment(text)
        if text == "":
            nxt = self.next_content(index + 1)
            if nxt is None:
                return None, len(self.lines)
            self.check_tabs(nxt)
            nxt_indent = self.indent_of(self.lines[nxt])
            nxt_content = self.lines[nxt][nxt_indent:]
            if nxt_indent > indent:
                return self.parse_block(nxt, nxt_indent)
            if allow_indentless and nxt_indent == indent and (nxt_content == "-" or nxt_content.startswith("- ")):
                return self.parse_sequence(nxt, indent)
            return None, index + 1
        # A plain scalar, possibly continued on more-indented lines.
        pieces = [(index, text)]
        end = index + 1
        last = end
        while end < len(self.lines):
            line = self.lines[end]
            if line.strip() == "":
                pieces.append((end, ""))
                end += 1
                continue
            if self.indent_of(line) <= indent or line.strip().startswith("#"):
                break
            self.check_tabs(end)
            pieces.append((end, self.strip_comment(line.strip())))
            end += 1
            last = end
        pieces = [(i, piece) for i, piece in pieces if i < last]
        for i, piece in pieces:
            if re.search(r":(\s|$)", piece):
                self.fail(i, "the value holds ': ' (or ends with ':'), which YAML reads as another key; "
                             "put the whole value in quotes")
        if len(pieces) == 1:
            return self.resolve_plain(text), last
        folded = ""
        for _, piece in pieces:
            if piece == "":
                folded += "\n"
            elif folded and not folded.endswith("\n"):
                folded += " " + piece
            else:
                folded += piece
        return folded, last

    def parse_block_scalar(self, index, header, indent):
        match = re.fullmatch(r"([|>])([-+]?)([1-9]?)([-+]?)\s*(#.*)?", header)
        if not match or (match.group(2) and match.group(4)):
            self.fail(index, "'%s' is not a valid block scalar header (use |, |-, >, >- and the like)" % header)
        style, chomp = match.group(1), match.group(2) or match.group(4)
        explicit = int(match.group(3)) if match.group(3) else None
        end = index + 1
        block = []
        content_indent = indent + explicit if explicit else None
        while end < len(self.lines):
            line = self.lines[end]
            if line.strip() == "":
                block.append("")
                end += 1
                continue
            line_indent = self.indent_of(line)
            if content_indent is None:
                if line_indent <= indent:
                    break
                content_indent = line_indent
            if line_indent < content_indent:
                if line_indent > indent:
                    self.fail(end, "a line of the block text is indented less than its first line")
                break
            self.check_tabs(end)
            block.append(line[content_indent:])
            end += 1
        # Trailing blank lines belong to chomping, not to the next key.
        trailing = 0
        while block and block[-1] == "":
            block.pop()
            trailing += 1
        if style == "|":
            text = "\n".join(block)
        else:
            # Folding: a single break between two ordinary lines becomes a
            # space; each empty line becomes a newline; breaks next to
            # more-indented lines are kept.
            text = ""
            previous = None
            blanks = 0
            for line in block:
                if line == "":
                    blanks += 1
                    continue
                more = line.startswith((" ", "\t"))
                if previous is not None and not blanks:
                    text += "\n" if (more or previous == "more") else " "
                elif previous is not None and (more or previous == "more"):
                    text += "\n"
                text += "\n" * blanks + line
                previous = "more" if more else "text"
                blanks = 0
        if block:
            if chomp == "-":
                pass
            elif chomp == "+":
                text += "\n" * (1 + trailing)
            else:
                text += "\n"
        return text, end

    def parse(self):
        start = self.next_content(0)
        if start is None:
            return None
        self.check_tabs(start)
        first_indent = self.indent_of(self.lines[start])
        value, end = self.parse_block(start, first_indent)
        rest = self.next_content(end)
        if rest is not None:
            self.fail(rest, "it is indented less than the first key, so it belongs to nothing")
        return value


def read_builtin(text):
    return BuiltinYaml(text).parse()


# --------------------------------------------------------------------------
# The checks.
# --------------------------------------------------------------------------

class Report:
    """The problems found in one folder, in the order they were found."""

    def __init__(self, label):
        self.label = label
        self.lines = []
        self.errors = 0
        self.warnings = 0

    def error(self, sentence):
        self.errors += 1
        self.lines.append("ERROR: %s: %s" % (self.label, one_line(sentence)))

    def warning(self, sentence):
        self.warnings += 1
        self.lines.append("WARNING: %s: %s" % (self.label, one_line(sentence)))


def scalar_text(value):
    """A YAML scalar as text, the way the loader reads it; None otherwise."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return None


def split_frontmatter(text):
    """Returns (frontmatter, body) or raises FrontmatterError."""
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        raise FrontmatterError("SKILL.md does not start with a '---' line opening the YAML frontmatter")
    for i in range(1, len(lines)):
        if lines[i].rstrip() == "---":
            return "".join(lines[1:i]), "".join(lines[i + 1:])
    raise FrontmatterError("the frontmatter is never closed: add a '---' line after the last key")


def check_name(report, value, folder_name):
    if value is None:
        report.error("the frontmatter has no name; add 'name: %s'" % folder_name)
        return
    name = scalar_text(value)
    if name is None:
        report.error("the name is not text; write it as a plain lowercase word like 'pdf-tools'")
        return
    if name.strip() == "":
        report.error("the name is empty; use the folder name '%s'" % folder_name)
        return
    if len(name) > MAX_NAME_CHARS:
        report.error("the name is %d characters long; the limit is %d" % (len(name), MAX_NAME_CHARS))
    if not NAME_PATTERN.fullmatch(name):
        report.error("the name '%s' may only hold lowercase letters a-z, digits 0-9 and hyphens" % name)
    if name.startswith("-") or name.endswith("-"):
        report.error("the name '%s' starts or ends with a hyphen" % name)
    if "--" in name:
        report.error("the name '%s' holds two hyphens in a row" % name)
    if name != folder_name:
        report.error("the name '%s' does not match its folder name '%s'; they must be identical"
                     % (name, folder_name))


def check_description(report, value):
    if value is None:
        report.error("the frontmatter has no description; say what the skill does and when to use it")
        return
    text = scalar_text(value)
    if text is None:
        report.error("the description is not text; write it as one string (use '>' for several lines)")
        return
    collapsed = " ".join(text.split())
    if not collapsed:
        report.error("the description is empty; say what the skill does and when to use it")
        return
    if len(collapsed) > MAX_DESCRIPTION_CHARS:
        report.error("the description is %d characters long; the limit is %d"
                     % (len(collapsed), MAX_DESCRIPTION_CHARS))
    elif len(collapsed) < SHORT_DESCRIPTION_CHARS:
        report.warning("the description is only %d characters; say what the skill does and when to use it, "
                       "with the words a user would type" % len(collapsed))


def check_flag(report, key, value):
    """A true/false key, read as the loader reads it: a YAML boolean, or the
    text true or false (which it accepts, and a client that reads YAML types
    may take for a string)."""
    if isinstance(value, bool):
        return
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        report.warning("%s is the text '%s'; skillhost reads it as %s, but write it unquoted so that "
                       "every client reads a boolean" % (key, value, value.strip().lower()))
        return
    report.warning("%s is not true or false; skillhost ignores it and uses %s"
                   % (key, "true" if key == "user-invocable" else "false"))


def check_frontmatter(report, data, folder_name):
    if data is None:
        data = {}
    if not isinstance(data, dict):
        report.error("the frontmatter is not a mapping of keys to values")
        return
    present = {key: value for key, value in data.items() if value is not None}
    check_name(report, present.get("name"), folder_name)
    check_description(report, present.get("description"))

    if "license" in present:
        text = scalar_text(present["license"])
        if text is None:
            report.error("the license is not text; write a license name such as 'Apache-2.0'")
        elif not text.strip():
            report.error("the license is empty; name a license or remove the key")

    if "compatibility" in present:
        text = scalar_text(present["compatibility"])
        if text is None:
            report.error("compatibility is not text; write one sentence about what the skill needs")
        else:
            chars = len(text.strip())
            if chars == 0:
                report.error("compatibility is empty; remove the key or say what the skill needs")
            elif chars > MAX_COMPATIBILITY_CHARS:
                report.error("compatibility is %d characters long; the limit is %d"
                             % (chars, MAX_COMPATIBILITY_CHARS))

    if "metadata" in present:
        metadata = present["metadata"]
        if not isinstance(metadata, dict):
            report.error("metadata is not a mapping; write one 'key: \"value\"' pair per indented line")
        else:
            for key, value in metadata.items():
                if not isinstance(key, str):
                    report.error("metadata has the key %r, which is not text; quote it" % (key,))
                elif not isinstance(value, str):
                    shown = "a list or mapping" if isinstance(value, (list, dict)) else "%r" % (value,)
                    report.error("metadata '%s' is %s, not a string; quote the value, as in %s: \"%s\""
                                 % (key, shown, key, scalar_text(value) or "..."))

    # The loader reads a wrong type of the keys below as a warning and goes
    # on without the key (or the entry), so the validator warns too.
    if "allowed-tools" in present:
        tools = present["allowed-tools"]
        if isinstance(tools, str):
            if not tools.strip():
                report.warning("allowed-tools is empty; remove the key or list the tools")
        elif isinstance(tools, list):
            if not all(scalar_text(t) is not None for t in tools):
                report.warning("allowed-tools has entries that are not text; skillhost drops them")
            else:
                report.warning("allowed-tools is a list; the specification defines one space-separated string, "
                               "such as 'allowed-tools: Bash(git:*) Read'")
        else:
            report.warning("allowed-tools is neither a space-separated string nor a list of tool names; "
                           "skillhost ignores it")

    for key in ("disable-model-invocation", "user-invocable"):
        if key in present:
            check_flag(report, key, present[key])

    if "argument-hint" in present:
        hint = scalar_text(present["argument-hint"])
        if hint is None:
            report.warning("argument-hint is not text; skillhost ignores it. Write it as one string, "
                           "such as 'argument-hint: \"[file] [format]\"'")
        else:
            chars = len(" ".join(hint.split()))
            if chars > MAX_ARGUMENT_HINT_CHARS:
                report.warning("argument-hint is %d characters long; skillhost shows the first %d"
                               % (chars, MAX_ARGUMENT_HINT_CHARS))

    if "model" in present:
        model = scalar_text(present["model"])
        if model is None:
            report.warning("model is not text; skillhost ignores it")
        else:
            report.warning("model '%s' does not apply in skillhost, which runs one model for every skill; "
                           "remove the key unless another client needs it" % model.strip())

    for key in data:
        if key not in KNOWN_KEYS:
            report.warning("'%s' is not a key the Agent Skills specification or skillhost defines; "
                           "move it under metadata or remove it" % (key,))


def check_tree(report, root):
    """Counts files and bytes the way the loader indexes them."""
    real_root = os.path.realpath(root)
    files = 0
    total = 0
    too_many = too_big = False
    for current, dirs, names in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_NAMES)
        for d in list(dirs):
            path = os.path.join(current, d)
            if os.path.islink(path):
                relative = os.path.relpath(path, root).replace(os.sep, "/")
                report.warning("'%s' is a link to a folder, which skillhost does not index" % relative)
                dirs.remove(d)
        for name in sorted(names):
            if name in SKIPPED_NAMES:
                continue
            path = os.path.join(current, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            try:
                info = os.stat(path)
            except OSError:
                report.warning("'%s' is a broken link or cannot be read; it is not served" % relative)
                continue
            if os.path.islink(path):
                target = os.path.realpath(path)
                if os.path.commonpath([real_root, target]) != real_root:
                    report.warning("'%s' is a link that leads outside the skill; it is not served" % relative)
                    continue
            if not stat.S_ISREG(info.st_mode):
                continue
            if info.st_nlink > 1 and not os.path.islink(path):
                report.warning("'%s' is a hard link; skillhost does not serve files with more than one name"
                               % relative)
                continue
            total += info.st_size
            if relative != "SKILL.md":
                files += 1
            if files > MAX_SKILL_FILES and not too_many:
                too_many = True
                report.error("the folder holds more than %d files besides SKILL.md" % MAX_SKILL_FILES)
            if total > MAX_SKILL_BYTES and not too_big:
                too_big = True
                report.error("the folder's files total more than %d bytes (256 MB)" % MAX_SKILL_BYTES)


LINK_TARGET = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
PATH_TOKEN = re.compile(
    r"(?<![\w./~:@$%{<\\-])"
    r"((?:\.{1,2}/)*[A-Za-z0-9_][\w.-]*(?:/[\w.-]+)*\.[A-Za-z0-9]+)"
    r"(?![\w/-]|\.\w)"
)


def check_references(report, root, body):
    """Checks the relative file paths the body mentions."""
    candidates = []  # (path, from_link)
    for match in LINK_TARGET.finditer(body):
        target = match.group(1)
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith(("#", "/", "~")):
            continue
        target = urllib.parse.unquote(target.split("#", 1)[0].split("?", 1)[0])
        if target:
            candidates.append((target, True))
    for match in PATH_TOKEN.finditer(body):
        if "/" in match.group(1):
            candidates.append((match.group(1), False))
    seen = set()
    for path, from_link in candidates:
        if path in seen:
            continue
        seen.add(path)
        segments = [s for s in path.split("/") if s not in ("", ".")]
        if ".." in segments:
            report.error("the body refers to '%s', which climbs out of the skill folder with '..'; "
                         "a skill may only refer to files inside its own folder" % path)
            continue
        if not segments:
            continue
        first = segments[0]
        checked = (from_link or path.startswith("./") or first in CONVENTIONAL_DIRS
                   or os.path.isdir(os.path.join(root, first)))
        if not checked:
            continue
        if not os.path.exists(os.path.join(root, *segments)):
            report.warning("the body refers to '%s', which does not exist in the skill folder" % path)


def check_folder(argument, read_yaml):
    path = argument
    if os.path.basename(os.path.normpath(path)) == "SKILL.md" and os.path.isfile(path):
        path = os.path.dirname(os.path.normpath(path)) or "."
    report = Report(os.path.normpath(path))
    if not os.path.isdir(path):
        report.error("is not a folder" if os.path.exists(path) else "does not exist")
        return report
    folder_name = os.path.basename(os.path.realpath(path))
    skill_md = os.path.join(path, "SKILL.md")
    if not os.path.isfile(skill_md):
        others = [n for n in os.listdir(path) if n.lower() == "skill.md" and n != "SKILL.md"]
        hint = " (found '%s'; the name is case-sensitive)" % others[0] if others else ""
        report.error("the folder has no SKILL.md%s" % hint)
        check_tree(report, path)
        return report
    size = os.path.getsize(skill_md)
    if size > MAX_SKILL_MD_BYTES:
        report.error("SKILL.md is %d bytes; the limit is %d bytes (4 MB)" % (size, MAX_SKILL_MD_BYTES))
        check_tree(report, path)
        return report
    with open(skill_md, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        report.error("SKILL.md is not valid UTF-8 text (byte %d)" % err.start)
        check_tree(report, path)
        return report
    try:
        frontmatter, body = split_frontmatter(text)
        data = read_yaml(frontmatter)
    except FrontmatterError as err:
        message = str(err)
        if not message.startswith(("SKILL.md", "the frontmatter")):
            message = "the frontmatter is not valid YAML: " + message
        report.error(message)
        check_tree(report, path)
        return report
    check_frontmatter(report, data, folder_name)
    if not body.strip():
        report.warning("SKILL.md has no body; write the instructions below the frontmatter")
    else:
        lines = text.count("\n") + (0 if text.endswith("\n") else 1)
        if lines > RECOMMENDED_MAX_LINES:
            report.warning("SKILL.md is %d lines long; keep it under %d and move detail into references/"
                           % (lines, RECOMMENDED_MAX_LINES))
    check_references(report, path, body)
    check_tree(report, path)
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Check Agent Skills folders (SKILL.md frontmatter, names, limits, file references).")
    parser.add_argument("folders", nargs="+", metavar="SKILL_DIR", help="a skill folder holding SKILL.md")
    parser.add_argument("--strict", action="store_true", help="treat warnings as failures")
    parser.add_argument("--builtin-parser", action="store_true",
                        help="read the frontmatter with the built-in reader even when PyYAML is installed")
    args = parser.parse_args(argv)
    read_yaml = None if args.builtin_parser else make_pyyaml_reader()
    if read_yaml is None:
        read_yaml = read_builtin
    failed = False
    for folder in args.folders:
        report = check_folder(folder, read_yaml)
        for line in report.lines:
            print(line)
        if report.errors or (args.strict and report.warnings):
            failed = True
        else:
            print("OK: %s" % report.label)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
