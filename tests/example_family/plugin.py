"""Registers the example family: name this module in `plugins=`, or load it into pytest with
`-p tests.example_family.plugin` to run the tests over every registered family with it."""

from longeval.tasks import register
from tests.example_family import FAMILY

register(FAMILY)
