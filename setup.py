"""The wheel carries the course: build_py copies notebooks/, docs/ and scripts/lab-settings/ into
ppkit/course/ of the build (ppkit/course/files.py says which files), so the repository keeps the one copy
and `ppkit course` finds them in an installed ppkit. An editable install reads them from the clone."""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

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
        for folder in {name.split("/")[0] for name in wanted}:  # an earlier build's copy: a file removed since
            shutil.rmtree(target / folder, ignore_errors=True)  # from the clone must not ship (build/ is reused)
        for name in wanted:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, target / name)


class SdistOfTrackedCourse(sdist):
    """MANIFEST.in grafts notebooks/ and docs/ whole; in a git checkout, keep only the course files git tracks
    (course_files), so a scratch notebook reaches neither the sdist nor the wheel built from it."""

    def make_release_tree(self, base_dir, files):
        module = _course_files_module()
        course = set(module.course_files(ROOT) + module.lab_settings_files(ROOT))
        folders = (*module.FOLDERS, module.LAB_SETTINGS)
        kept = [name for name in files
                if not Path(name).as_posix().startswith(tuple(f"{f}/" for f in folders))
                or Path(name).as_posix() in course]
        super().make_release_tree(base_dir, kept)


setup(cmdclass={"build_py": BuildPyWithCourse, "sdist": SdistOfTrackedCourse})
