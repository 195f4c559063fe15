"""``python -m benchmarks``: check, then time, every kernel of the course on an NVIDIA GPU.

    python -m benchmarks                      # everything (a few minutes on an H100)
    python -m benchmarks --topics relu,gelu   # some topics
    python -m benchmarks --quick              # smaller sizes: a smoke test (<name>-quick.*)
    python -m benchmarks --stale              # (any machine) the topics whose sources changed since recorded
    python -m benchmarks --update --stale     # re-measure only those, keep the rest of h100.json
    python -m benchmarks --help

In one run it measures the copy roofline (a device-to-device copy of 2^28 floats), every
version of every topic (relu, gelu, reduction, softmax) in CUDA C++, Numba and Triton that
``kernels.versions(topic, lang)`` lists, PyTorch and ``torch.compile``, at the sizes of
``utils.PROBLEM_SIZES["gpu"]`` (2^28 elements; the four softmax shapes), plus a size sweep.

Each kernel is first checked against a float64 reference (awkward sizes, then the timed
size); a wrong one is recorded as "failed check" and never timed. A version whose
description says "demo only" (or that its module lists in ``DEMO_ONLY``) is not timed.

It writes, into ``benchmarks/results/``:

* ``h100.json``: the machine, software versions, date, the git commit measured (from git, or
  ``$COURSE_COMMIT`` in a copy without ``.git``), sizes, medians, 20th/80th percentiles, GB/s
  and the fraction of the copy bandwidth (schema: ``utils/bench.py``);
* ``h100.md``: a summary with each of the course's targets met or missed;
* per topic, ``topic_sources`` in ``h100.json``: a hash of the files its numbers measured
  (kernels, launchers, the headers and modules they include or import, the spec:
  ``benchmarks/sources.py``), which ``--stale`` and the notebooks' "measured on an earlier
  version of this kernel" compare with the files here;
* ``h100-<topic>.png``: GB/s against size, with the copy roofline.

(The stem is the GPU's name: ``h100`` on an H100.) Notebooks read these through
``utils.bench``. Each topic runs in its own worker process, so a kernel that crashes the
GPU context costs only itself.

Exit codes: 0 when the run finished (kernels that failed their check are listed in the
results, not an error), 1 on an unexpected error, 2 on a machine without a GPU or with
``COURSE_SIMULATE=1``: the command then measures nothing, says why and points to the
recorded results.
"""
