"""The suite's folders mirror the package (tests/<layer>/test_<module>.py); every test imports the shared
helpers as ``common``, so tests/ is on the import path whichever folder a test lives in."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
