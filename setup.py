"""The wheel carries the course: build_py copies notebooks/, docs/ and scripts/lab-settings/ into
ppkit/course/ of the build (ppkit/course/files.py says which files), so the repository keeps the one copy
and `ppkit course` finds them in an installed ppkit. An editable install reads them from the clone."""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _course_files_module():
    spec = importlib.util.spec_from_file_location("_ppkit_course_files", ROOT / "ppkit" / "course" / "files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithCourse(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # the clone's own notebooks/ and docs/ are read in place
            return
        files = _course_files_module()
        wanted = files.course_files(ROOT) + files.lab_settings_files(ROOT)
        if not any(name.startswith("notebooks/") for name in wanted):
            raise RuntimeError(f"no notebooks under {ROOT / 'notebooks'}: a wheel without the course would be "
                               "built. Build from a clone or from the sdist (MANIFEST.in grafts notebooks/ and docs/).")
        target = Path(self.build_lib) / "ppkit" / "course"
        for name in wanted:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, target / name)


setup(cmdclass={"build_py": BuildPyWithCourse})
