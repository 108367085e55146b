"""requirements.txt, environment.yml and the installed packages must name the same versions."""

from importlib import metadata
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def parse_pins(lines):
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.split("[")[0].strip().lower()] = version.strip()
    return pins


def requirement_pins():
    return parse_pins((ROOT / "requirements.txt").read_text().splitlines())


def conda_pins():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict))
    return parse_pins(pip_section)


def test_environment_yml_pins_match_requirements():
    assert conda_pins() == requirement_pins()


def test_key_pins_are_the_ones_that_work_here():
    pins = requirement_pins()
    assert (pins["torch"], pins["torchvision"], pins["webdataset"]) == ("2.14.1", "0.29.1", "1.0.2")


def test_installed_versions_match_pins():
    installed = {name: metadata.version(name) for name in requirement_pins()}
    assert installed == requirement_pins()
