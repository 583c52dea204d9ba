# callgate as a container: the image installs the wheel built from this repository (the
# Avro schemas and the default profile ship inside the wheel), with the locked versions.

# 1. Build the wheel and export the lock's runtime pins.
FROM python:3.11-slim AS build
WORKDIR /src
COPY requirements/uv.txt requirements/uv.txt
RUN pip install --no-cache-dir --require-hashes -r requirements/uv.txt
COPY pyproject.toml uv.lock README.md ./
COPY services ./services
COPY projections ./projections
COPY schemas ./schemas
RUN uv build --wheel --out-dir /dist \
 && uv export --frozen --no-hashes --no-emit-project --output-file /dist/constraints.txt

# 2. Install it, as a user would: pip, the wheel, the locked versions.
FROM python:3.11-slim
COPY --from=build /dist /dist
RUN pip install --no-cache-dir --constraint /dist/constraints.txt /dist/callgate-*.whl \
 && rm -rf /dist
ENV CALLGATE_STATE_DIR=/data
VOLUME /data
ENTRYPOINT ["callgate"]
CMD ["serve"]
