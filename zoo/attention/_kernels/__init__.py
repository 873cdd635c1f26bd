"""The fast paths of the attention variants, one module (or folder) a family: the CPU kernels with hand-written
backwards, the fused Triton kernels, the window gathers. Each computes what its variant's plain reference function
computes (in the variant's own file), and the tests hold it to that reference; `zoo.attention._paths.choose_path`
decides which one a call takes."""
