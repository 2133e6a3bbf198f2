#!/usr/bin/python3
"""Run the documentation's examples and check the output they show.

Reads the fenced blocks of README.md, doc/*.md and clients/README.md (or the
files named on the command line) and, in one throwaway cluster (idem in
shared_preload_libraries, a Unix socket in a private directory), runs each
page in a database of its own:

  ```sql      consecutive blocks run in one psql session (psql -X: psql's
              default output, command tags and CONTEXT lines included; errors
              do not stop it); the page's first session runs
              CREATE EXTENSION idem unless the page creates it itself
  ```python   /usr/bin/python3, PYTHONPATH=clients/python
  ```js       node (CommonJS), NODE_PATH=clients/node and its node_modules
  ```sh       bash -e, psql on the PATH

Python, Node and shell blocks connect through the libpq variables (PGHOST,
PGPORT, PGDATABASE, PGUSER), set to the page's database, and run from the
top of the tree (built: scripts/test.sh runs it in its built copy).  A ```text block right after a block (blank lines between
allowed) is its expected output: psql's output (stdout and stderr, as psql
prints them), or the program's; trailing blanks of each line are not
compared.  A block without one must not fail: no ERROR from psql, exit
status 0 from the others.  ```sql-notest (```python-notest, ...) marks a
block that is only illustrative; it is counted, not run.  ```sql-citus
marks an example that needs a Citus cluster: test/citus runs it verbatim
(scripts/test-citus.sh), this runner only counts it.  The README's
quick-start block is not run here: .ci/run runs it verbatim on a fresh
machine (scripts/fresh-machine.sh).  A line <!-- doc: fresh database -->
before a block starts a new database from that block on (e.g. for a Node
example that repeats the Python one before it).

After each page its database is dropped, the roles it made are dropped and
ALTER SYSTEM settings are reset, so pages do not see each other.

Runs as the cluster user (initdb refuses root): as root it copies the tree
for postgres and runs itself there through runuser (scripts/test.sh calls
it through runuser in its own copy).  PG_CONFIG names the PostgreSQL to use.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_LANGS = ("sql", "python", "js", "sh")
# fence names that look like examples but would not be run: refused, so
# that an example cannot slip past the runner under another name
ALIASES = {"bash": "sh", "shell": "sh", "console": "sh", "zsh": "sh", "psql": "sql",
           "pgsql": "sql", "postgres": "sql", "postgresql": "sql", "plpgsql": "sql",
           "py": "python", "python3": "python", "javascript": "js", "node": "js",
           "mjs": "js", "cjs": "js"}
SHOW = False
UPDATES = []  # (file, line of a text block's fence, the output got) for --update
PORT = 5432  # the socket lives in a private directory: no clash with others


class Block:
    def __init__(self, path, line, lang, text):
        self.path, self.line, self.lang, self.text = path, line, lang, text
        self.expected = None  # the ```text block that follows, if any
        self.expected_line = None
        self.fresh = False  # preceded by <!-- doc: fresh database -->

    def where(self):
        return f"{os.path.relpath(self.path, TOP)}:{self.line}"


def parse(path):
    """The fenced blocks of a Markdown file, with their expected outputs."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks = []
    i = 0
    heading = None
    quick_start_seen = False
    fresh = False
    while i < len(lines):
        if lines[i].strip() == "<!-- doc: fresh database -->":
            fresh = True
        m = re.match(r"^(\s*)(`{3,})(\S*)\s*$", lines[i])
        h = re.match(r"^#{1,6}\s+(.*?)\s*$", lines[i])
        if h:
            heading = h.group(1)
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3)
        start = i + 1
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*" + fence + r"\s*$", lines[i]):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        if i >= len(lines):
            sys.exit(f"{path}:{start}: unclosed ``` block")
        i += 1
        b = Block(path, start, lang, "\n".join(body) + "\n")
        if lang != "text":
            b.fresh, fresh = fresh, False
        # the quick start: scripts/fresh-machine.sh runs it, not us
        if (os.path.basename(path) == "README.md" and os.path.dirname(path) == TOP
                and heading == "Quick start" and lang == "sh" and not quick_start_seen):
            quick_start_seen = True
            b.lang = "sh-quickstart"
        fence_at = start - 1
        if lang == "text" and blocks and blocks[-1].lang in RUN_LANGS and blocks[-1].expected is None \
                and all(l.strip() == "" for l in lines[blocks[-1].end:fence_at]):
            blocks[-1].expected = b.text
            blocks[-1].expected_line = start
            continue
        b.end = i  # index of the line after the closing fence
        blocks.append(b)
    return blocks


class Cluster:
    def __init__(self, pg_config):
        self.bindir = subprocess.check_output([pg_config, "--bindir"], text=True).strip()
        self.dir = tempfile.mkdtemp(prefix="idem-doc.")
        self.data = os.path.join(self.dir, "data")
        self.env = {
            "PATH": self.bindir + ":/usr/local/bin:/usr/bin:/bin",
            "HOME": self.dir,
            "PGHOST": self.dir,
            "PGPORT": str(PORT),
            "PGUSER": "postgres",
            "PGDATABASE": "postgres",
            "PGCLIENTENCODING": "UTF8",
            "TZ": "UTC",
        }

    def run(self, args, **kw):
        # from the cluster's directory: the caller's (root's home, under
        # runuser) may be closed to the cluster user, and psql says so on
        # stderr, which the outputs compared include
        kw.setdefault("cwd", self.dir)
        return subprocess.run(args, env=self.env, **kw)

    def start(self):
        # the encoding stated: without LANG initdb would make SQL_ASCII
        self.run([f"{self.bindir}/initdb", "-D", self.data, "-A", "trust", "-U", "postgres",
                  "--encoding=UTF8", "--no-locale"], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("listen_addresses = ''\n"
                    f"unix_socket_directories = '{self.dir}'\n"
                    f"port = {PORT}\n"
                    "shared_preload_libraries = 'idem'\n"
                    "fsync = off\n"
                    "timezone = 'UTC'\n"
                    "max_prepared_transactions = 10\n"
                    "wal_level = logical\n")
        self.run([f"{self.bindir}/pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "log"),
                  "-w", "start"], check=True, stdout=subprocess.DEVNULL)

    def stop(self):
        self.run([f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "immediate", "stop"],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def psql(self, db, script, check=False, opts=()):
        p = self.run([f"{self.bindir}/psql", "-X", *opts, "-d", db],
                     input=script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if check and (p.returncode != 0 or "ERROR:" in p.stdout):
            raise RuntimeError(f"psql on {db} failed:\n{script}\n{p.stdout}")
        return p.stdout


def norm(s):
    return "\n".join(l.rstrip() for l in s.rstrip("\n").split("\n")).rstrip("\n")


def compare(expected, got):
    return norm(expected) == norm(got)


def show_diff(expected, got):
    import difflib
    return "\n".join(difflib.unified_diff(norm(expected).split("\n"), norm(got).split("\n"),
                                         "shown", "got", n=2, lineterm="")) + "\n"


def node_modules(env):
    """node-postgres for the Node examples: from the committed lock file
    (npm ci), as scripts/test-clients.sh installs it, when it is missing."""
    node = os.path.join(TOP, "clients/node")
    if subprocess.run(["node", "-e", 'require.resolve("pg")'], cwd=node, env=env,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--no-update-notifier", "--loglevel=error"], cwd=node,
                       env=env, check=True)


def run_segment(cluster, runnable, db, stats, failures):
    """Blocks of a page that share one database, in order."""
    cluster.psql("postgres", f'CREATE DATABASE "{db}";', check=True)
    env = dict(cluster.env, PGDATABASE=db)
    creates_ext = any(b.lang == "sql" and re.search(r"(?i)create\s+extension\s+idem\b", b.text)
                      for b in runnable)
    if not creates_ext:
        cluster.psql(db, "CREATE EXTENSION idem;", check=True)
    scratch = tempfile.mkdtemp(prefix="page.", dir=cluster.dir)

    # consecutive sql blocks form one psql session
    groups = []
    for b in runnable:
        if b.lang == "sql" and groups and groups[-1][0].lang == "sql":
            groups[-1].append(b)
        else:
            groups.append([b])

    for g in groups:
        if g[0].lang == "sql":
            marks = [f"@@doc-block-{n}@@" for n in range(len(g))]
            script = "".join(f"\\echo {m}\n{b.text}" for m, b in zip(marks, g)) + "\\echo @@doc-end@@\n"
            out = cluster.psql(db, script)
            parts = re.split(r"^@@doc-(?:block-\d+|end)@@\n", out, flags=re.M)
            if len(parts) != len(g) + 2:
                failures.append(f"{g[0].where()}: psql session lost its markers:\n{out}")
                continue
            outputs = parts[1:-1]
            if parts[-1].strip():
                outputs[-1] += parts[-1]
        else:
            b = g[0]
            if b.lang == "python":
                args = ["/usr/bin/python3", "-c", b.text]
                benv = dict(env, PYTHONPATH=os.path.join(TOP, "clients/python"))
            elif b.lang == "js":
                node_modules(env)
                f = os.path.join(scratch, f"block{b.line}.js")
                open(f, "w").write(b.text)
                args = ["node", f]
                benv = dict(env, NODE_PATH=os.path.join(TOP, "clients/node") + ":" +
                            os.path.join(TOP, "clients/node/node_modules"))
            else:
                args = ["bash", "-e", "-c", b.text]
                benv = env
            p = subprocess.run(args, env=dict(benv, TMPDIR=scratch), cwd=TOP,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=300)
            outputs = [p.stdout + ("" if p.returncode == 0 else f"[exit status {p.returncode}]\n")]
        for b, out in zip(g, outputs):
            stats[b.lang] += 1
            if SHOW:
                print(f"=== {b.where()} ({b.lang})\n{out}", end="")
            if b.expected is not None:
                stats["compared"] += 1
                if not compare(b.expected, out):
                    failures.append(f"{b.where()}: output differs from the text block at line "
                                    f"{b.expected_line}:\n" + show_diff(b.expected, out))
                    UPDATES.append((b.path, b.expected_line, out))
            elif re.search(r"^(ERROR|FATAL|PANIC):", out, re.M) or "[exit status" in out \
                    or (b.lang != "sql" and "Traceback" in out):
                failures.append(f"{b.where()}: the block failed:\n{out}")


def run_page(cluster, path, db, stats, failures):
    blocks = parse(path)
    for b in blocks:
        base = b.lang[:-len("-notest")] if b.lang.endswith("-notest") else b.lang
        if base in ALIASES:
            failures.append(f"{b.where()}: a ```{b.lang} block is not run: write ```{ALIASES[base]}"
                            + ("-notest" if b.lang.endswith("-notest") else ""))
        if b.lang.endswith("-notest"):
            stats["notest"] += 1
        elif b.lang == "sh-quickstart":
            stats["quickstart"] += 1
        elif b.lang == "sql-citus":
            stats["citus"] += 1
        elif b.lang.split("-")[0] in RUN_LANGS and b.lang not in RUN_LANGS:
            failures.append(f"{b.where()}: a ```{b.lang} block is neither run nor marked -notest")
    runnable = [b for b in blocks if b.lang in RUN_LANGS]
    if not runnable:
        return
    segments = []
    for b in runnable:
        if not segments or b.fresh:
            segments.append([])
        segments[-1].append(b)
    for n, seg in enumerate(segments):
        run_segment(cluster, seg, f"{db}_{n}", stats, failures)
        cluster.psql("postgres", f'DROP DATABASE "{db}_{n}" WITH (FORCE);', check=True)

    # leave nothing for the next page: its database, its roles, ALTER SYSTEM
    roles = cluster.psql("postgres", "SELECT quote_ident(rolname) FROM pg_roles "
                         "WHERE rolname !~ '^pg_' AND rolname <> 'postgres';",
                         check=True, opts=("-A", "-t")).split()
    reset = "ALTER SYSTEM RESET ALL;\nSELECT pg_reload_conf();\n"
    if roles:
        reset = "DROP ROLE " + ", ".join(roles) + ";\n" + reset
    cluster.psql("postgres", reset, check=True)


def update_text_blocks(updates):
    """Replace the body of each text block (by its fence's line) with out."""
    by_file = {}
    for path, line, out in updates:
        by_file.setdefault(path, []).append((line, out))
    for path, items in by_file.items():
        lines = open(path, encoding="utf-8").read().split("\n")
        for line, out in sorted(items, reverse=True):  # bottom first: line numbers hold
            fence = lines[line - 1]
            indent = fence[:len(fence) - len(fence.lstrip())]
            end = line
            while not lines[end].strip().startswith("```"):
                end += 1
            body = [(indent + l).rstrip() if l else "" for l in out.rstrip("\n").split("\n")]
            lines[line:end] = body
        open(path, "w", encoding="utf-8").write("\n".join(lines))


def anchors(text):
    """GitHub's anchors of a Markdown text's headings."""
    seen, res, inb = {}, set(), False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            inb = not inb
            continue
        m = None if inb else re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(a)
            seen[a] = 0 if n is None else n + 1
            res.add(a if n is None else f"{a}-{n + 1}")
    return res


def link_checks(files):
    """Every relative link of the pages: its anchor exists in the page it
    names.  A page that does not exist is only reported (pages of features
    on other branches are linked before they merge)."""
    problems, notes = [], set()
    for f in files:
        text = open(f, encoding="utf-8").read()
        for m in re.finditer(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
            target, anchor = m.group(1), m.group(2)
            if re.match(r"[a-z]+:", target):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(f), target)) if target else f
            where = os.path.relpath(f, TOP)
            if not os.path.exists(path):
                notes.add(f"{where}: links to {os.path.relpath(path, TOP)}, which does not exist (yet)")
            elif anchor and path.endswith(".md") and anchor not in anchors(open(path, encoding="utf-8").read()):
                problems.append(f"{where}: link to {target}#{anchor}: no such heading")
    return problems, sorted(notes)


def reference_checks():
    """What the reference pages must list, read from the code: every
    SQLSTATE of src/idem.h in doc/api.md's table, every idem.* setting the C
    code defines in doc/configuration.md's, every C file of src/ in
    doc/internals.md, every function, procedure and view of the install
    scripts somewhere in doc/."""
    problems = []
    src = lambda *p: open(os.path.join(TOP, *p), encoding="utf-8").read()
    api = src("doc", "api.md")
    table = api[api.index("\n## SQLSTATEs"):]
    for m in re.finditer(r"MAKE_SQLSTATE\('(.)',\s*'(.)',\s*'(.)',\s*'(.)',\s*'(.)'\)", src("src", "idem.h")):
        code = "".join(m.groups())
        if not re.search(r"^\| `" + code + "`", table, re.M):
            problems.append(f"doc/api.md: SQLSTATE {code} (src/idem.h) has no row in the SQLSTATE table")
    conf = src("doc", "configuration.md")
    for root, _, names in os.walk(os.path.join(TOP, "src")):
        for n in names:
            if n.endswith(".c"):
                for g in re.findall(r'DefineCustom\w+Variable\(\s*"(idem\.\w+)"', src(root, n)):
                    if not re.search(r"^(\| `|### `)" + re.escape(g) + "`", conf, re.M):
                        problems.append(f"doc/configuration.md: setting {g} ({os.path.relpath(os.path.join(root, n), TOP)}) is not documented")
    internals = src("doc", "internals.md")
    for root, _, names in os.walk(os.path.join(TOP, "src")):
        for n in names:
            if n.endswith(".c") and f"`{n}`" not in internals:
                problems.append(f"doc/internals.md: {os.path.relpath(os.path.join(root, n), TOP)} is not in the layers' table")
    docs = "".join(src("doc", f) for f in os.listdir(os.path.join(TOP, "doc")) if f.endswith(".md"))
    for f in sorted(os.listdir(TOP)):
        if re.match(r"idem--.*\.sql$", f):
            for name in re.findall(r"(?i)CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE|VIEW)\s+(?:@extschema@\.|idem\.)?(\w+)", src(f)):
                if not re.search(r"\b" + name + r"\b", docs):
                    problems.append(f"doc/: {name} ({f}) is mentioned on no page")
    return sorted(set(problems))


def main():
    ap = argparse.ArgumentParser(description="Run the docs' examples and check their output.")
    ap.add_argument("files", nargs="*", help="Markdown files (default: README.md, doc/*.md, clients/README.md)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's directory")
    ap.add_argument("--update", action="store_true",
                    help="write the output got into the text blocks that differ (read the diffs first)")
    ap.add_argument("--print", action="store_true", dest="show",
                    help="print every block's output (to write a text block: read it first)")
    a = ap.parse_args()
    global SHOW
    SHOW = a.show
    if os.geteuid() == 0:
        # initdb refuses root: run as postgres, in a copy of the tree it owns
        # (the shell examples run from the top of the tree and may write there)
        os.environ["PATH"] = os.environ.get("PATH") or "/usr/sbin:/usr/bin:/sbin:/bin"
        copy = tempfile.mkdtemp(prefix="idem-doc-tree.")
        subprocess.run(f"tar -C {TOP} --exclude=.git -cf - . | tar -C {copy} -xf - && chown -R postgres: {copy}",
                       shell=True, check=True)
        me = os.path.join(copy, os.path.relpath(os.path.abspath(__file__), TOP))
        files = [os.path.join(copy, os.path.relpath(os.path.abspath(f), TOP)) for f in a.files]
        opts = (["--keep"] if a.keep else []) + (["--print"] if a.show else []) + \
            (["--update"] if a.update else [])
        if a.update:
            sys.exit("test/doc/run.py: --update as root would write into a copy; run it as the tree's owner")
        try:
            r = subprocess.run(["runuser", "-u", "postgres", "--", "env",
                                f"PG_CONFIG={os.environ.get('PG_CONFIG', '')}",
                                "/usr/bin/python3", me] + opts + files)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        sys.exit(r.returncode)
    pg_config = os.environ.get("PG_CONFIG") or "/usr/lib/postgresql/15/bin/pg_config"
    files = [os.path.abspath(f) for f in a.files] or (
        [os.path.join(TOP, "README.md")] +
        sorted(os.path.join(TOP, "doc", f) for f in os.listdir(os.path.join(TOP, "doc")) if f.endswith(".md")) +
        [os.path.join(TOP, "clients/README.md")])
    t0 = time.time()
    failures = [] if a.files else reference_checks()
    links, notes = link_checks(files)
    failures += links
    for n in notes:
        print(f"note: {n}")
    cluster = Cluster(pg_config)
    stats = {k: 0 for k in RUN_LANGS + ("compared", "notest", "quickstart", "citus")}
    try:
        cluster.start()
        print(f"  cluster started: {time.time() - t0:.1f} s", flush=True)
        for n, f in enumerate(files):
            tp = time.time()
            run_page(cluster, f, f"doc_{n}", stats, failures)
            print(f"  {os.path.relpath(f, TOP)}: {time.time() - tp:.1f} s", flush=True)
    finally:
        cluster.stop()
        if failures or a.keep:
            print(f"test/doc/run.py: cluster kept in {cluster.dir}")
        else:
            shutil.rmtree(cluster.dir, ignore_errors=True)
    for f in failures:
        print(f"FAIL {f}")
    if a.update and UPDATES:
        update_text_blocks(UPDATES)
        print(f"test/doc/run.py: {len(UPDATES)} text blocks rewritten from the output got")
    ran = sum(stats[k] for k in RUN_LANGS)
    print(f"doc examples: {ran} blocks run in {len(files)} files "
          f"(sql {stats['sql']}, python {stats['python']}, js {stats['js']}, sh {stats['sh']}), "
          f"{stats['compared']} outputs compared, {stats['notest']} marked -notest, "
          f"quick start left to fresh-machine.sh: {stats['quickstart']}, "
          f"Citus examples left to test/citus: {stats['citus']}; "
          f"{len(failures)} failed; {time.time() - t0:.1f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
