"""The documents a newcomer trusts stay true: every exit code of cohort/base/exit_codes.h is
in docs/exit-codes.md (and every code there is one), and every file and function that
docs/map.md names exists in the tree."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_exit_code_is_documented_and_every_documented_code_exists():
    header = (REPO / "cohort/base/exit_codes.h").read_text()
    codes = {int(v): k for k, v in re.findall(r"inline constexpr int (kExit\w+) = (\d+);", header)}
    assert len(codes) >= 10, header
    doc = (REPO / "docs/exit-codes.md").read_text()
    documented = {int(c) for c in re.findall(r"^\| (\d+) \|", doc, re.M)}
    assert set(codes) - documented == set(), "in exit_codes.h, not in docs/exit-codes.md: %s" % {
        c: codes[c] for c in set(codes) - documented}
    assert documented - set(codes) == set(), "in docs/exit-codes.md, not in exit_codes.h: %s" % (
        documented - set(codes))


def _expand(path):  # "store/protocol.{h,cc}" -> both files
    m = re.match(r"(.*)\{([^}]*)\}(.*)", path)
    if not m:
        return [path]
    return [m.group(1) + part + m.group(3) for part in m.group(2).split(",")]


def test_the_map_names_files_and_functions_that_exist():
    text = (REPO / "docs/map.md").read_text()
    missing = []
    for token in re.findall(r"`([^`\s]+)`", text) + re.findall(r"\| ([\w./{},-]+\.\w+) ", text):
        for candidate in re.findall(r"[\w./{},-]+\.(?:cc|h|py|sh|md|mjs)\b", token):
            for path in _expand(candidate.split(",")[0] if "{" not in candidate else candidate):
                path = path.strip(",")
                if "/" not in path and any((REPO / "cohort").rglob(path)):
                    continue  # a bare file name, named beside its directory
                if not any((base / path).exists()
                           for base in (REPO, REPO / "cohort", REPO / "docs", REPO / "tools")):
                    missing.append(path)
    assert not missing, "docs/map.md names files that do not exist: %s" % sorted(set(missing))
    sources = "\n".join(p.read_text(errors="replace") for p in (REPO / "cohort").rglob("*")
                        if p.suffix in (".cc", ".h", ".py"))
    start = text.index("## Where to start reading")
    end = text.index("\n## ", start + 5)
    names = set()
    for token in re.findall(r"`([^`]+)`", text[start:end]):
        for name in re.findall(r"(?:^|::)([A-Z][A-Za-z0-9]+)$", token):
            names.add(name)
    assert len(names) >= 10, names
    gone = sorted(n for n in names if not re.search(r"\b%s\b" % n, sources))
    assert not gone, "docs/map.md's reading path names what the code no longer has: %s" % gone


def test_the_environment_is_read_through_settings_and_the_worker_contract_only():
    # base/settings.cc (COHORT_* knobs and SystemEnv) and base/worker_env.cc (what cohort
    # run hands its workers) are the two readers; anything else goes through them.
    allowed = {"cohort/base/settings.cc", "cohort/base/worker_env.cc"}
    raw = []
    for p in (REPO / "cohort").rglob("*"):
        if p.suffix not in (".cc", ".h") or p.name.endswith("_test.cc"):
            continue
        rel = str(p.relative_to(REPO))
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if re.search(r"\b(?:std::)?(?:secure_)?getenv\s*\(", line) and rel not in allowed \
                    and not line.lstrip().startswith("//"):
                raw.append("%s:%d: %s" % (rel, n, line.strip()))
    assert not raw, "raw getenv (use SystemEnv or a setting):\n" + "\n".join(raw)


# Functions still over the limit, to be split. Nothing may join this list.
LONG_FUNCTIONS_TO_SPLIT = set()


def test_no_production_function_is_longer_than_100_lines():
    import shutil
    import subprocess
    ctags = shutil.which("ctags-universal") or shutil.which("ctags")
    if ctags is None:
        import pytest
        pytest.skip("universal-ctags is not installed (tools/install-deps.sh)")
    out = subprocess.run([ctags, "--fields=+ne", "--c++-kinds=f", "--languages=C++", "-R",
                          "-o", "-", "cohort"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    long = []
    for line in out.splitlines():
        fields = line.split("\t")
        extra = dict(f.split(":", 1) for f in fields[3:] if ":" in f)
        if "line" not in extra or "end" not in extra or fields[1].endswith("_test.cc"):
            continue
        n = int(extra["end"]) - int(extra["line"]) + 1
        if n > 100 and (fields[1], fields[0]) not in LONG_FUNCTIONS_TO_SPLIT:
            long.append("%s %s: %d lines" % (fields[1], fields[0], n))
    assert not long, "split these into named steps (docs/map.md, rules):\n" + "\n".join(long)


# No file in cohort/ passes 800 lines, tests included: a longer one is split at its seams.
MAX_FILE_LINES = 800


def test_no_source_file_grows_past_800_lines():
    over = []
    for p in (REPO / "cohort").rglob("*"):
        if p.suffix not in (".cc", ".h", ".py"):
            continue
        n = len(p.read_text(errors="replace").splitlines())
        if n > MAX_FILE_LINES:
            over.append("%s: %d lines" % (p.relative_to(REPO), n))
    assert not over, "split these at their seams:\n" + "\n".join(over)


def test_no_file_includes_settings_without_using_it():
    idle = []
    for p in (REPO / "cohort").rglob("*"):
        if p.suffix not in (".cc", ".h"):
            continue
        text = p.read_text(errors="replace")
        if '#include "cohort/base/settings.h"' in text and p.name not in ("settings.cc",) and \
                not re.search(r"settings::|SystemEnv|SettingInfo|AllSettings|Setting<|SettingBase",
                              text):
            idle.append(str(p.relative_to(REPO)))
    assert not idle, "these include base/settings.h and use nothing from it: %s" % idle
