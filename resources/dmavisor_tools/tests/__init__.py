"""Unit tests of the tools' pure parts (`make unit` runs them with
python3 -m unittest; see the Makefile)."""
