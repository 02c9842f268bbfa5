# The two commands a newcomer runs on a fresh clone (README.md):
#   make demo   - installs .venv if needed, then a short TFF simulation
#   make test   - installs .venv if needed, then the default test suite
PY := .venv/bin/python

.PHONY: install demo test test-all clean

install:
	@bash scripts/install.sh

demo: install
	$(PY) -m programs.run --algorithm=fedavg,nofl,afedcl --dataset=digits \
	  --partition=dirichlet --alpha=0.3 --num_clients=10 --clients_per_round=10 \
	  --rounds=10 --local_epochs=2 --model=mlp --batch_size=20 \
	  --output_dir=/tmp/tff_pfl_demo --seed=0 --noresume --progress=false

test: install
	$(PY) -m pytest -q

test-all: install
	$(PY) -m pytest -q -m ""

clean:
	rm -rf .venv .pytest_cache
