"""Operations tooling: demo, replay, benchmarks and the chaos run."""
