"""Reads enums and integer #defines from gradwire.h (no hand-mirrored lists)."""

import re

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_ENUM = re.compile(r"typedef\s+enum\s*(?:\w+\s*)?\{(?P<body>[^}]*)\}\s*(?P<name>\w+)\s*;", re.S)
_DEFINE = re.compile(r"^\s*#\s*define\s+(?P<name>\w+)\s+(?P<value>-?(?:0[xX][0-9a-fA-F]+|\d+))[uUlL]*\s*$", re.M)


class HeaderError(ImportError):
    pass


def _int(text, names, where):
    text = text.strip()
    try:
        return int(text, 0)
    except ValueError:
        pass
    if text in names:
        return names[text]
    raise HeaderError(f"gradwire.h: cannot evaluate {text!r} in {where}")


def parse(text, path="gradwire.h"):
    """Returns (enums, defines): enums maps a typedef name to {enumerator: value}
    in declaration order; defines maps integer macro names to values."""
    text = _COMMENT.sub(" ", text)
    enums = {}
    for m in _ENUM.finditer(text):
        members, known, nxt = {}, {}, 0
        for item in m.group("body").split(","):
            item = item.strip()
            if not item:
                continue
            name, eq, value = item.partition("=")
            name = name.strip()
            if not re.fullmatch(r"[A-Za-z_]\w*", name):
                raise HeaderError(f"{path}: bad enumerator {item!r} in {m.group('name')}")
            nxt = _int(value, known, m.group("name")) if eq else nxt
            members[name] = known[name] = nxt
            nxt += 1
        enums[m.group("name")] = members
    defines = {m.group("name"): int(m.group("value"), 0) for m in _DEFINE.finditer(text)}
    return enums, defines


def load(path, required=("gwResult_t", "gwDataType_t", "gwRedOp_t")):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise HeaderError(f"cannot read gradwire header {path}: {e}") from e
    enums, defines = parse(text, path)
    missing = [r for r in required if not enums.get(r)]
    if missing:
        raise HeaderError(f"{path}: no 'typedef enum {{...}} NAME;' block for {', '.join(missing)}")
    return enums, defines
