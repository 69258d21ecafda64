#!/usr/bin/env python3
"""Writes a man page (roff) for a cohort program from what its --help prints: the program's
own help and, for `cohort`, each command's. Usage: man.py PROGRAM NAME SUMMARY OUT [COMMAND...]
Thread-safety: a build step; one process."""
import datetime
import subprocess
import sys


def roff(text):
    """Help text as preformatted roff: backslashes doubled, leading dots escaped."""
    lines = []
    for line in text.rstrip().splitlines():
        line = line.replace("\\", "\\e")
        if line.startswith((".", "'")):
            line = "\\&" + line
        lines.append(line)
    return "\n".join(lines)


def help_of(argv):
    done = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=60)
    return done.stdout or done.stderr


def main(argv):
    program, name, summary, out, *commands = argv
    date = datetime.date.today().strftime("%Y-%m-%d")
    parts = ['.TH "%s" 1 "%s" "cohort" "User Commands"' % (name.upper(), date),
             ".SH NAME", "%s \\- %s" % (name, summary),
             ".SH SYNOPSIS", "\\fB%s\\fR [\\fIcommand\\fR] [\\fIoptions\\fR]" % name,
             ".SH DESCRIPTION", ".nf", roff(help_of([program])), ".fi"]
    for command in commands:
        parts += [".SH COMMAND: %s" % command.upper(), ".nf",
                  roff(help_of([program, command])), ".fi"]
    parts += [".SH SEE ALSO", "The documentation in /usr/share/doc/cohort (README.md, docs/)."]
    with open(out, "w") as f:
        f.write("\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
