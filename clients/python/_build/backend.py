"""A PEP 517 build backend for the idem client, in the tree so that
``pip install clients/python`` needs nothing from a package index: it
writes a pure-Python wheel (and an sdist) of the modules that
pyproject.toml's [tool.idem-build] lists, with the metadata of its
[project] table.  Only what this project uses is supported."""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11: read the few keys by hand
    tomllib = None

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _project():
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        text = f.read()
    if tomllib is not None:
        data = tomllib.loads(text.decode())
        return data["project"], data["tool"]["idem-build"]["modules"]
    s = text.decode()

    def one(key):
        return re.search(rf'^{key}\s*=\s*"([^"]*)"', s, re.M).group(1)

    def many(key):
        return re.findall(r'"([^"]+)"', re.search(rf'^{key}\s*=\s*\[([^\]]*)\]', s, re.M).group(1))
    project = {"name": one("name"), "version": one("version"),
               "description": one("description"), "dependencies": many("dependencies"),
               "requires-python": one("requires-python"), "license": {"text": "PostgreSQL"}}
    return project, many("modules")


def _metadata(p):
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p['description']}", f"License: {p['license']['text']}",
             f"Requires-Python: {p['requires-python']}"]
    lines += [f"Requires-Dist: {d}" for d in p["dependencies"]]
    return "\n".join(lines) + "\n"


def _dist(p):
    return f"{p['name'].replace('-', '_')}-{p['version']}"


def get_requires_for_build_wheel(config_settings=None):
    return []


get_requires_for_build_sdist = get_requires_for_build_editable = get_requires_for_build_wheel


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p, _ = _project()
    info = os.path.join(metadata_directory, _dist(p) + ".dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(_metadata(p))
    return os.path.basename(info)


def _wheel(wheel_directory, files):
    """files: [(name in the wheel, bytes)]; adds the dist-info and RECORD."""
    p, _ = _project()
    info = _dist(p) + ".dist-info"
    files = files + [(f"{info}/METADATA", _metadata(p).encode()),
                     (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: idem _build/backend.py\n"
                                       b"Root-Is-Purelib: true\nTag: py3-none-any\n")]
    record = []
    name = f"{_dist(p)}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _, modules = _project()
    files = []
    for m in modules:
        with open(os.path.join(HERE, m + ".py"), "rb") as f:
            files.append((m + ".py", f.read()))
    return _wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # a .pth file putting this directory on sys.path
    return _wheel(wheel_directory, [("idem_client_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p, modules = _project()
    name = _dist(p)
    with tarfile.open(os.path.join(sdist_directory, name + ".tar.gz"), "w:gz") as t:
        for rel in ["pyproject.toml", "_build/backend.py"] + [m + ".py" for m in modules]:
            t.add(os.path.join(HERE, rel), f"{name}/{rel}")
        data = _metadata(p).encode()
        ti = tarfile.TarInfo(f"{name}/PKG-INFO")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    return name + ".tar.gz"
