"""The services' command lines as docs/serving.md writes them, parsed by the one parser (no
server starts), and the same --help for each."""

import pytest

from sao_jax.config_cli import ConfigError, parse_cli
from serving.gateway.config import GatewayConfig
from serving.local import LocalServerConfig
from serving.proxy.config import ProxyConfig
from serving.router.config import RouterConfig
from serving.worker.config import WorkerConfig

W1, W2, P, R = "http://127.0.0.1:8101", "http://127.0.0.1:8111", "http://127.0.0.1:8102", "R"


def parse(cls, line: str):
    return parse_cli(line.split(), cls, exit_on_error=False)


def test_the_documented_separate_process_lines():
    worker = parse(WorkerConfig, "--config tiny --port 8101 --service-key K")
    assert (worker.preset, worker.port, worker.service_key) == ("tiny", 8101, "K")
    router = parse(RouterConfig, f"--port 8103 --proxies {P}/ --workers {W1},{W2} --service-key K")
    assert router.proxies == (P,) and router.workers == (W1, W2)  # trailing / dropped
    proxy = parse(ProxyConfig, f"--port 8102 --buffer /data/atdp --router {R} --service-key K")
    assert (proxy.buffer, proxy.router, proxy.port) == ("/data/atdp", R, 8102)
    gateway = parse(
        GatewayConfig,
        f"--port 8000 --router {R} --proxies {P} --admin-key A1234567 --state-dir /var/sao",
    )
    assert (gateway.proxies, gateway.admin_key, gateway.state_dir) == ((P,), "A1234567", "/var/sao")


def test_the_one_process_server_nests_its_worker(tmp_path):
    line = (
        f"--config tiny --port 8000 --buffer {tmp_path} --admin-key KEY12345 --warmup "
        "--num-slots 4 --context-length none --request-timeout-s 30 --redact-disable phone,email"
    )
    config = parse(LocalServerConfig, line)
    assert config.worker.preset == "tiny" and config.worker.warmup is True
    assert config.worker.num_slots == 4 and config.worker.context_length is None
    # one timeout for the process: the worker's is the server's, the gateway waits longer
    assert config.worker.request_timeout_s == 30.0
    assert config.gateway_config().request_timeout_s == 60.0
    assert config.proxy_config().redact_disable == ("phone", "email")
    assert config.state_dir == str(tmp_path / "gateway_state")
    upstream = parse(
        LocalServerConfig,
        f"--upstream http://vllm:8000/v1 --upstream-key K --upstream-token-ids --buffer {tmp_path}",
    )
    assert upstream.upstream == "http://vllm:8000/v1" and upstream.upstream_token_ids is True
    with pytest.raises(
        ConfigError, match=r"--buffer \(the ATDP store to record into\) is required"
    ):
        parse(LocalServerConfig, "--port 1")
    with pytest.raises(ConfigError, match="unknown option '--service-key'"):  # no meaning here
        parse(LocalServerConfig, f"--buffer {tmp_path} --service-key K")
    with pytest.raises(ConfigError, match=r"WorkerConfig\.num_slots must be >= 1"):
        parse(LocalServerConfig, f"--buffer {tmp_path} --num-slots 0")


@pytest.mark.parametrize(
    "module", ["serving", "serving.worker", "serving.router", "serving.proxy", "serving.gateway"]
)
def test_every_service_prints_the_same_help(module, capsys):
    main = __import__(f"{module}.__main__", fromlist=["main"]).main
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: python -m {module} [--key VALUE | key=VALUE ...]")
    header = next(line for line in text.splitlines() if line.startswith("field "))
    assert header.split() == ["field", "type", "default", "help"]
    fields = {line.split()[0] for line in text.splitlines() if line[:1].isalpha()}
    assert {"host", "port"} <= fields
    if module in ("serving", "serving.worker"):  # the model preset, also spelled --config
        assert "preset" in fields and "(also --config)" in text
