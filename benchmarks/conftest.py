import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # so the suite can import bench_loss
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the smoke tests' shared helpers, `common`
