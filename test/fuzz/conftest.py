"""The fuzz tests reuse the test tree's interpreters (tt_interp, bundle_interp)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
