"""Everything the tests share, importable as `support.<module>` (tests/ is on sys.path through
tests/conftest.py): the control plane and its tools, the fake and process kubelets, the operator
process, readers/writers of a namespace's objects, local-run helpers, one TrainingJob builder
(`jobs`), one PodView builder (`pods`), one `wait_for` (`waiting`), a benchmark at its smoke size
(`benchmarks`), the chart installed as a user installs it (`release`), and the real node (`node`,
with its configuration `nodeconfig`, host-state check `hoststate`, `ociimage` archives,
`dnsquery` and the node tests' pods `nodepods`).

tests/cluster/ holds only what builds the binaries (install.sh, gowrapper/, coredns/)."""
