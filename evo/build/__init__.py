"""Build: NVRTC compiles in killable child processes, the ptxas report, the build cache."""
