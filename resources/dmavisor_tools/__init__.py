"""The programs behind the commands in resources/ (run-kvm, test-lanes, ...).

Each command there is a small wrapper that imports its module from here;
common.py holds what the programs share.
"""
