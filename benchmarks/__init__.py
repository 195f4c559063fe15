"""``python -m benchmarks``: check, then time, every kernel of the course on an NVIDIA GPU.

    python -m benchmarks                      # everything (a few minutes on an H100 or H200)
    python -m benchmarks --topics relu,gelu   # some topics
    python -m benchmarks --quick              # smaller sizes: a smoke test (<name>-quick.*)
    python -m benchmarks --stale              # (any machine) the topics whose sources changed since
                                              # their most recent record, and whether a GPU
                                              # validation call is due
    python -m benchmarks --update --stale     # re-measure only those into this GPU's record
    python -m benchmarks --help

In one run it measures the copy roofline (a device-to-device copy of 2^28 floats), every
version of every topic (relu, gelu, reduction, softmax) in CUDA C++, Numba and Triton that
``kernels.versions(topic, lang)`` lists, PyTorch and ``torch.compile``, at the sizes of
``utils.PROBLEM_SIZES["gpu"]`` (2^28 elements; the four softmax shapes), plus a size sweep.

Each kernel is first checked against a float64 reference (awkward sizes, then the timed
size); a wrong one is recorded as "failed check" and never timed. A version whose
description says "demo only" (or that its module lists in ``DEMO_ONLY``) is not timed.

It writes this GPU's record into ``benchmarks/results/records/``, one record per GPU; the stem
is the GPU's short name (``utils.gpu_slug``: ``h100`` on an H100, ``h200`` on an H200), so a
run on another GPU leaves the others' records as they are:

* ``<gpu>.json``: the machine, software versions, date, the git commit measured (from git, or
  ``$COURSE_COMMIT`` in a copy without ``.git``), sizes, medians, 20th/80th percentiles, GB/s
  and the fraction of the copy bandwidth (schema: ``utils/bench.py``);
* ``<gpu>.md``: a summary with each of the course's targets met or missed;
* per topic, ``topic_commits`` (the commit and date it was measured at) and ``topic_sources``
  in ``<gpu>.json``: a hash of the files its numbers measured (kernels, launchers, the
  headers and modules they include or import, the spec: ``utils/sources.py``), which
  ``--stale`` and the notebooks' "measured on an earlier version of this kernel" compare with
  the files here;
* ``<gpu>-<topic>.png``: GB/s against size, with the copy roofline.

Notebooks read these through ``utils.bench``: each topic from the most recent record that
has it (``utils.recorded_file``), labelled with that record's GPU. Each topic runs in its own
worker process, so a kernel that crashes the GPU context costs only itself.

``--stale`` checks each topic against its most recent record of any GPU (``--name h100``:
that record alone), then says whether code under ``kernels/``, ``utils/``, ``notebooks/``,
``exercises/`` or ``solutions/`` changed since the commit that the newest
``results/validation/<gpu>-validation.txt`` (``.ci/gpu-validate.sh``) tested, committed or
not: then a GPU validation call is due (``benchmarks/validation.py``).

Exit codes: 0 when the run finished (kernels that failed their check are listed in the
results, not an error; ``--stale`` alone exits 0 whether or not topics are stale or a
validation call is due: it reports), 1 on an unexpected error, 2 on a machine without a GPU
or with ``COURSE_SIMULATE=1``: the command then measures nothing, says why and points to the
recorded results.

Layout
------
The command above is this folder's top: ``run.py`` (the run), ``harness.py`` (check, then
time, one topic), ``topics.py`` (what each topic measures), ``attention.py``,
``layernorm.py`` and ``matmul_fp16.py`` (the topics with a worker of their own: masks and
passes, LayerNorm's backward and RMSNorm, the bfloat16 matmul), ``report.py`` (the JSON, the
summary, the plots), ``validation.py`` (is a GPU validation call due?), and
``rerecord_gpu_run.sh``, which brings a GPU's recordings up to date, every room's included.
The other scripts are in rooms, each with its index in its ``__init__.py``:

    tune/         sweeps and probes that choose a kernel's settings
    lessons/      captures that a lesson shows
    simulators/   the course's simulators and profiler measured, and checked against the GPU

Naming: a script is lower_snake_case and named for what it measures, the subject first (a
topic, a kernel, a model or one of the course's tools: ``softmax``, ``matmul``, ``gpt``,
``emulator``, ``ncu``), then the measurement (``_tune``, ``_probe``, ``_speed``, ``_train``,
``_vs_gpu``, ...). No lesson number, no ``bench`` and no ``_gpu`` that only says where it
runs: the room's index says which lesson shows it, and the script's docstring where it runs.
A bash script that runs a GPU session is
``<subject>_gpu_run.sh``, in the room of what it runs. A script runs as
``python -m benchmarks.<room>.<name>`` from the course's root (or as a file,
``python benchmarks/<room>/<name>.py``).

``results/`` is grouped by who reads it (``runtime.paths`` names each folder):

    records/      each GPU's record: <gpu>.json, <gpu>.md, <gpu>-<topic>.png (RECORDS_DIR)
    lessons/      what the lessons show: profiler traces, probes, captures (LESSON_RESULTS_DIR)
    simulators/   the simulators' and profiler's speed and their answers beside the GPU's
                  (SIMULATOR_RESULTS_DIR)
    tune/         the tuning sweeps (TUNE_RESULTS_DIR)
    validation/   <gpu>-validation.txt and cpu-validation.txt (VALIDATION_DIR)

One GPU's file carries its ``utils.gpu_slug`` (``h200-print-loss.json``, ``ncu-h200.json``);
``utils.recorded_gpu_file`` finds the newest GPU's one in any kind.
"""
