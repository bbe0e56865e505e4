"""Maps the top-level architecture folders into the one import package.

assignors/, topology/ and state/ sit at the top of the repository so its layout shows the
architecture, but they install as pystreams.assignors, pystreams.topology and pystreams.state,
so nothing else lands in site-packages. pyproject.toml holds everything else.
"""

from setuptools import find_packages, setup

ROOTS = {
    "pystreams": "pystreams",
    "pystreams.assignors": "assignors",
    "pystreams.topology": "topology",
    "pystreams.state": "state",
}

packages, package_dir = [], {}
for package, folder in ROOTS.items():
    package_dir[package] = folder
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_packages(folder)]

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"pystreams.protocol": ["schemas/*.json"]},
)
