"""The course's own simulators and profiler, measured: how fast they run on a CPU, and whether
they give the GPU's answers. Results in ``benchmarks/results/simulators/``.

    emulator_speed      the CUDA C++ emulator's speed: two kernels and compiling a source
                        (emulator-speed.json)
    ncu_patterns        the launches that Nsight Compute and the course's profiler both measure
                        (a table the next two import)
    ncu_run             those launches on a GPU: Nsight Compute's counters (ncu-<gpu>.json,
                        ncu-<gpu>-sections.txt), compute-sanitizer on racy and out-of-bounds
                        kernels (<gpu>-sanitizer.txt), a torch.profiler trace of a training loop
                        (lessons/<gpu>-profiler-loop.*: lesson 08 shows it)
    ncu_vs_sim          utils.profile in simulation against the recorded counters, case by case
                        (ncu-vs-sim.json, .md)
    numba_sim_speed     Numba's CUDA simulator, stock and with the course's patch
                        (numba-simulator-speed.json)
    profile_speed       how long utils.profile takes in the emulator (profile-speed.json)
    published_survey    whether published CUDA C++ runs in the emulator as written
                        (published-survey.json)
    sim_vs_gpu          every grader verdict, in simulation and on a GPU (sim-vs-gpu.json, .md)
    triton_tutorials    Triton's official tutorials in Triton's interpreter
                        (triton-tutorials-simulation.json)

GPU session, run with bash from the course's root on the GPU machine:

    ncu_gpu_run.sh      ncu_run's steps under ncu, Nsight Systems and compute-sanitizer

Each script runs as ``python -m benchmarks.simulators.<name>`` from the course's root
(``--help``, or the usage at the top of the script). Names: subject first, then what is
measured (the rule is in ``benchmarks/__init__.py``).
"""
