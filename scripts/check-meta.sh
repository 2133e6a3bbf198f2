#!/usr/bin/env bash
# Check META.json (the PGXN distribution metadata) against the PGXN Meta
# Spec 1.0.0 and against the tree it describes:
#
#   - it is a JSON object with every field the spec requires (name,
#     abstract, version, maintainer, license, provides, meta-spec), each of
#     the type and form the spec gives it, and the optional fields it uses
#     (description, prereqs, resources, tags, release_status, no_index,
#     generated_by) well formed; any other top-level key must start x_;
#   - its version is idem.control's default_version as a semantic version
#     (the spec requires SemVer: default_version '1.1' is "1.1.0"), and so
#     is the version of the extension it provides;
#   - the provided extension's file is the base of the install chain
#     (idem--1.0.sql), and every file and docfile it names
#     exists;
#   - the upstream part of debian/changelog's top version is that
#     default_version too.
#
# When pgxnclient is installed (Debian package pgxnclient), its own SemVer
# parser must accept the versions as well.  Needs only /usr/bin/python3,
# which it installs from Debian's archive when run as root without it (a
# fresh minimal Debian has none).
#
#   scripts/check-meta.sh [TREE]      (default: this repository's top)
set -euo pipefail

top=${1:-$(cd "$(dirname "$0")/.." && pwd)}

if [ ! -x /usr/bin/python3 ]; then
	[ "$(id -u)" -eq 0 ] || { echo "check-meta: needs /usr/bin/python3 (package python3)" >&2; exit 1; }
	echo "check-meta: installing python3" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=600 update -qq
	apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends python3 >/dev/null
fi

exec /usr/bin/python3 - "$top" <<'PY'
import json, os, re, sys

top = sys.argv[1]
errors = []
def err(msg):
    errors.append(msg)

def read(path):
    with open(os.path.join(top, path), encoding="utf-8") as f:
        return f.read()

# --- the spec's value types -------------------------------------------------
# SemVer 1.0.0, as the spec requires: MAJOR.MINOR.PATCH, an optional
# pre-release part after a dash (alphanumerics, starting with a letter)
SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[A-Za-z][0-9A-Za-z-]*)?$")
# a Term: at least two characters, no slash, backslash or control character
TERM = re.compile(r"^[^/\\\x00-\x1f\x7f]{2,}$")
TAG = re.compile(r"^[^/\\\x00-\x1f\x7f]{1,255}$")
# a version range: an operator-less version, or comma-separated "op version"
RANGE_PART = re.compile(r"^\s*(==|!=|>=|<=|>|<)?\s*[0-9][0-9A-Za-z.+-]*\s*$")
LICENSES = {
    "agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd",
    "freebsd", "gfdl_1_2", "gfdl_1_3", "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1",
    "lgpl_3_0", "mit", "mozilla_1_0", "mozilla_1_1", "openssl", "perl_5",
    "postgresql", "qpl_1_0", "ssleay", "sun", "zlib", "open_source",
    "restricted", "unrestricted", "unknown",
}
PHASES = {"configure", "build", "test", "runtime", "develop"}
RELATIONS = {"requires", "recommends", "suggests", "conflicts"}
STATUSES = {"stable", "testing", "unstable"}
URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$")

def is_str(v, nonempty=True):
    return isinstance(v, str) and (v.strip() != "" or not nonempty)

def check_version(where, v):
    if not isinstance(v, str) or not SEMVER.match(v):
        err(f"{where}: {v!r} is not a semantic version (MAJOR.MINOR.PATCH)")

def check_range(where, v):
    if v == 0 or v == "0":
        return
    if not isinstance(v, str) or not all(RANGE_PART.match(p) for p in v.split(",")):
        err(f"{where}: {v!r} is not a version range")

# --- the file ----------------------------------------------------------------
try:
    meta = json.loads(read("META.json"))
except (OSError, ValueError) as e:
    print(f"check-meta: META.json: {e}", file=sys.stderr)
    sys.exit(1)
if not isinstance(meta, dict):
    print("check-meta: META.json is not a JSON object", file=sys.stderr)
    sys.exit(1)

# --- required fields -----------------------------------------------------------
for field in ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"):
    if field not in meta:
        err(f"missing required field {field!r}")

if "name" in meta and not (isinstance(meta["name"], str) and TERM.match(meta["name"])):
    err(f"name: {meta['name']!r} is not a term (2+ characters, no slash, backslash or control character)")
if "abstract" in meta and not is_str(meta["abstract"]):
    err("abstract: must be a non-empty string")
if "version" in meta:
    check_version("version", meta["version"])
if "maintainer" in meta:
    m = meta["maintainer"]
    if not (is_str(m) or (isinstance(m, list) and m and all(is_str(x) for x in m))):
        err("maintainer: must be a string or a non-empty list of strings")
if "license" in meta:
    lic = meta["license"]
    if isinstance(lic, str):
        ok = lic in LICENSES
    elif isinstance(lic, list):
        ok = bool(lic) and all(isinstance(x, str) and x in LICENSES for x in lic)
    elif isinstance(lic, dict):
        ok = bool(lic) and all(is_str(k) and isinstance(u, str) and URI.match(u) for k, u in lic.items())
    else:
        ok = False
    if not ok:
        err(f"license: {lic!r} is not a license name of the spec, a list of them, or a name -> URL object")
if "meta-spec" in meta:
    ms = meta["meta-spec"]
    if not isinstance(ms, dict) or ms.get("version") != "1.0.0":
        err("meta-spec: must be an object with version \"1.0.0\"")
    elif "url" in ms and not (isinstance(ms["url"], str) and URI.match(ms["url"])):
        err("meta-spec.url: must be a URI")

provides = meta.get("provides")
if "provides" in meta:
    if not isinstance(provides, dict) or not provides:
        err("provides: must be an object naming at least one extension")
        provides = {}
    for ext, p in provides.items():
        where = f"provides.{ext}"
        if not TERM.match(ext):
            err(f"{where}: the extension name is not a term")
        if not isinstance(p, dict):
            err(f"{where}: must be an object")
            continue
        for field in ("file", "version"):
            if field not in p:
                err(f"{where}: missing required field {field!r}")
        if "version" in p:
            check_version(f"{where}.version", p["version"])
        for field in ("file", "docfile"):
            if field in p:
                if not is_str(p[field]):
                    err(f"{where}.{field}: must be a path")
                elif not os.path.isfile(os.path.join(top, p[field])):
                    err(f"{where}.{field}: {p[field]} does not exist in the tree")
        if "abstract" in p and not is_str(p["abstract"]):
            err(f"{where}.abstract: must be a non-empty string")
        for field in p:
            if field not in ("file", "version", "abstract", "docfile") and not field.lower().startswith("x_"):
                err(f"{where}: unknown field {field!r}")
else:
    provides = {}

# --- optional fields -----------------------------------------------------------
if "description" in meta and not is_str(meta["description"]):
    err("description: must be a non-empty string")
if "generated_by" in meta and not is_str(meta["generated_by"]):
    err("generated_by: must be a non-empty string")
if "release_status" in meta and meta["release_status"] not in STATUSES:
    err(f"release_status: must be one of {sorted(STATUSES)}")
if "tags" in meta:
    t = meta["tags"]
    if not (isinstance(t, list) and t and all(isinstance(x, str) and TAG.match(x) for x in t)):
        err("tags: must be a non-empty list of tags (1-255 characters, no slash, backslash or control character)")
def members(where, obj, allowed=None, what="member"):
    """The (name, value) pairs of object obj, each name one of allowed."""
    if not isinstance(obj, dict):
        err(f"{where}: must be an object")
        return []
    for k in obj:
        if allowed is not None and k not in allowed:
            err(f"{where}: unknown {what} {k!r}")
    return obj.items()

if "prereqs" in meta:
    for phase, rels in members("prereqs", meta["prereqs"], PHASES, "phase"):
        for rel, reqs in members(f"prereqs.{phase}", rels, RELATIONS, "relationship"):
            for name, rng in members(f"prereqs.{phase}.{rel}", reqs):
                check_range(f"prereqs.{phase}.{rel}.{name}", rng)
if "resources" in meta:
    rs = meta["resources"]
    if not isinstance(rs, dict):
        err("resources: must be an object")
    else:
        for k, v in rs.items():
            if k == "homepage":
                if not (isinstance(v, str) and URI.match(v)):
                    err("resources.homepage: must be a URI")
            elif k in ("bugtracker", "repository"):
                allowed = {"bugtracker": ("web", "mailto"), "repository": ("url", "web", "type")}[k]
                if not isinstance(v, dict) or not v or any(f not in allowed and not f.lower().startswith("x_") for f in v):
                    err(f"resources.{k}: must be an object with some of {allowed}")
            elif not k.lower().startswith("x_"):
                err(f"resources: unknown resource {k!r}")
if "no_index" in meta:
    ni = meta["no_index"]
    if not isinstance(ni, dict) or any(k not in ("file", "directory") for k in ni):
        err("no_index: must be an object with file and/or directory")
KNOWN = {"name", "abstract", "version", "maintainer", "license", "provides", "meta-spec",
         "description", "generated_by", "release_status", "tags", "prereqs", "resources", "no_index"}
for k in meta:
    if k not in KNOWN and not k.lower().startswith("x_"):
        err(f"unknown top-level field {k!r} (custom fields start with x_)")

# --- agreement with the tree ---------------------------------------------------
control = read("idem.control")
m = re.search(r"^\s*default_version\s*=\s*'([^']*)'", control, re.M)
if not m:
    err("idem.control has no default_version")
else:
    default = m.group(1)
    # the control file's version as a SemVer: "1.1" is 1.1.0
    parts = default.split(".")
    semver = ".".join(parts + ["0"] * (3 - len(parts))) if len(parts) <= 3 else default
    if meta.get("version") != semver:
        err(f"version {meta.get('version')!r} does not match idem.control's default_version "
            f"'{default}' (as a semantic version: {semver!r})")
    if "idem" not in provides:
        err("provides: does not name the extension idem")
    else:
        p = provides["idem"]
        if p.get("version") != semver:
            err(f"provides.idem.version {p.get('version')!r} is not {semver!r} (default_version '{default}')")
        # one install chain: the base script, then the update scripts
        if p.get("file") != "idem--1.0.sql":
            err(f"provides.idem.file {p.get('file')!r} is not idem--1.0.sql, the base of the install chain")
    try:
        first = read("debian/changelog").splitlines()[0]
        dm = re.match(r"^\S+ \(([^)]*)\)", first)
        upstream = dm.group(1).split(":")[-1].rsplit("-", 1)[0] if dm else None
        if upstream != default:
            err(f"debian/changelog's top version {dm.group(1) if dm else first!r} is not of upstream '{default}'")
    except OSError:
        pass

# --- pgxnclient's own parser, where installed ----------------------------------
try:
    from pgxnclient.utils.semver import SemVer
except ImportError:
    SemVer = None
if SemVer is not None:
    for where, v in [("version", meta.get("version"))] + \
            [(f"provides.{e}.version", p.get("version")) for e, p in provides.items() if isinstance(p, dict)]:
        try:
            SemVer(v)
        except Exception as e:
            err(f"{where}: pgxnclient does not accept {v!r}: {e}")

if errors:
    print("check-meta: META.json is not valid:", file=sys.stderr)
    for e in errors:
        print(f"  {e}", file=sys.stderr)
    sys.exit(1)
print(f"check-meta: META.json is valid (PGXN Meta Spec 1.0.0), version {meta['version']} "
      f"= idem.control '{default}'" + (", pgxnclient's SemVer agrees" if SemVer else ""))
PY
