"""Everything the tests share, importable as `support.<module>` (tests/ is on sys.path through
tests/conftest.py): the control plane and its tools, the fake and process kubelets, the operator
process, readers/writers of a namespace's objects, local-run helpers, one TrainingJob builder
(`jobs`), one PodView builder (`pods`) and one `wait_for` (`waiting`).

tests/cluster/ holds only what builds the control plane's binaries (install.sh, gowrapper/)."""
