"""``python -m smgrl.fake --kind sglang --ports 31000-31003``"""

from smgrl.fake.cli import fake_engine

fake_engine(prog_name="python -m smgrl.fake")
