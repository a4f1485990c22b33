"""`mtp specbench`: end-to-end decoding speed of a run's MTP drafters against plain decoding and the
Hugging Face peers, lossless checked on every prompt. It drives the decoders in `mtp_cli.decode`, which
know nothing of it. `run` plans and drives one benchmark; `runners` are the methods it times; `measure`
times them and summarises; `forward_cost` and `costs` time the forwards that explain a speed-up;
`schema` lays out specbench.json; `render` prints it."""
