/**
 * Docker cannot run here, so the deployment files are checked against the
 * code instead: they parse, every ASSAY_* variable they set is one the config
 * knows, the probes hit routes that exist, the replicas share one database and
 * one Redis, the load balancer lists both replicas, and grace periods exceed
 * the drain.
 */
import fs from "node:fs";
import path from "node:path";
import { parse, parseAllDocuments } from "yaml";
import { describe, expect, it } from "vitest";
import { ROOT, loadConfig } from "../../src/config/index.js";

const DEPLOY = path.join(ROOT, "scripts", "deploy");
const read = (f: string) => fs.readFileSync(path.join(DEPLOY, f), "utf8");
const configSource = fs.readFileSync(path.join(ROOT, "src", "config", "index.ts"), "utf8");
const README = fs.readFileSync(path.join(ROOT, "README.md"), "utf8");

/** Every env var a deployment sets must be read by the config (a typo would be silently ignored). */
function expectKnownEnv(env: Record<string, string>, where: string) {
  for (const name of Object.keys(env)) {
    // Node's and npm's own variables, not assay's.
    if (name === "NODE_ENV" || name === "ONNXRUNTIME_NODE_INSTALL" || name.startsWith("npm_config_")) continue;
    expect(configSource, `${where}: ${name} is not a config variable`).toMatch(new RegExp(`\\b${name}:`));
    expect(README, `${where}: ${name} is not documented in README`).toContain(`\`${name}\``);
  }
  // And the values parse.
  expect(() => loadConfig(env), where).not.toThrow();
}

function dockerEnv(text: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const m of text.replace(/\\\n/g, " ").matchAll(/^ENV (.+)$/gm)) {
    for (const kv of m[1]!.matchAll(/(\w+)=(\S+)/g)) env[kv[1]!] = kv[2]!;
  }
  return env;
}

describe("Dockerfiles", () => {
  it.each(["Dockerfile", "Dockerfile.cuda"])("%s builds with the bootstrap and runs the compiled server", (file) => {
    const text = read(file);
    // A supported Node line (package.json engines), the one CI runs.
    expect(text).toMatch(/^FROM node:26-/m);
    expect(text).toContain("RUN node scripts/bootstrap.mjs");
    expect(text).toMatch(/^CMD \["node", "dist\/src\/main\.js"\]$/m);
    expect(text).toMatch(/^STOPSIGNAL SIGTERM$/m);
    expect(text).toContain("/readyz");
    // Every path it copies from the build context exists.
    for (const m of text.matchAll(/^COPY (?!--from)(.+) \S+$/gm)) {
      for (const src of m[1]!.split(/\s+/)) expect(fs.existsSync(path.join(ROOT, src)), `${file}: COPY ${src}`).toBe(true);
    }
    expectKnownEnv(dockerEnv(text), file);
  });

  it("the CUDA image installs onnxruntime's CUDA binaries and selects the CUDA provider", () => {
    const text = read("Dockerfile.cuda");
    expect(text).toContain("ONNXRUNTIME_NODE_INSTALL=cuda12");
    // Set before the build stage's bootstrap, which then writes the builds' s8 x s8 (CUDA) graphs.
    const build = text.slice(0, text.indexOf("RUN node scripts/bootstrap.mjs"));
    expect(build).toMatch(/^ENV .*ASSAY_EXECUTION_PROVIDER=cuda/m);
    expect(dockerEnv(text)).toMatchObject({ ASSAY_EXECUTION_PROVIDER: "cuda" });
    expect(text).toMatch(/^FROM nvidia\/cuda:12\.\S+-cudnn-runtime/m);
  });
});

describe("compose.yaml", () => {
  const doc = parse(read("compose.yaml"), { merge: true }) as {
    services: Record<string, { environment?: Record<string, string>; image?: string; volumes?: string[]; stop_grace_period?: string; depends_on?: unknown }>;
  };

  it("two replicas share one PostgreSQL and one Redis, behind nginx", () => {
    const s = doc.services;
    expect(Object.keys(s).sort()).toEqual(["assay-1", "assay-2", "lb", "postgres", "redis"]);
    const [a, b] = [s["assay-1"]!, s["assay-2"]!];
    expect(a.environment).toEqual(b.environment);
    expect(a.environment!.ASSAY_DATABASE_URL).toMatch(/^postgres:\/\/\S+@postgres:5432\//);
    expect(a.environment!.ASSAY_REDIS_URL).toBe("redis://redis:6379");
    expectKnownEnv(a.environment!, "compose.yaml");
    // Each replica keeps its own data dir (its first-start key file); accounts live in PostgreSQL.
    expect(a.volumes).not.toEqual(b.volumes);
    const drain = Number(a.environment!.ASSAY_DRAIN_SECONDS);
    expect(Number.parseInt(a.stop_grace_period!, 10)).toBeGreaterThan(drain);
    expect(s.lb!.volumes).toContain("./nginx.conf:/etc/nginx/nginx.conf:ro");
  });

  it("nginx balances over both replicas and passes the api_key header", () => {
    const conf = read("nginx.conf");
    expect(conf).toContain("server assay-1:8000");
    expect(conf).toContain("server assay-2:8000");
    expect(conf).toMatch(/underscores_in_headers on;/);
    expect(conf).toMatch(/proxy_next_upstream [^;]*http_503/);
    const timeout = Number(/proxy_read_timeout (\d+)s;/.exec(conf)?.[1]);
    // Above the longest deadline assay can grant (deadlines by work), not only the default one:
    // a request admitted with a long deadline must not be cut by the proxy.
    expect(timeout * 1000).toBeGreaterThan(Number(doc.services["assay-1"]!.environment!.ASSAY_REQUEST_TIMEOUT_MAX_MS));
    expect(Number(doc.services["assay-1"]!.environment!.ASSAY_REQUEST_TIMEOUT_MAX_MS)).toBeGreaterThanOrEqual(
      Number(doc.services["assay-1"]!.environment!.ASSAY_REQUEST_TIMEOUT_MS),
    );
  });
});

describe("Kubernetes", () => {
  const deployment = parse(read("k8s/deployment.yaml")) as {
    kind: string;
    spec: {
      replicas: number;
      selector: { matchLabels: Record<string, string> };
      template: {
        metadata: { labels: Record<string, string> };
        spec: {
          terminationGracePeriodSeconds: number;
          containers: {
            env: { name: string; value?: string; valueFrom?: { secretKeyRef: { name: string; key: string } } }[];
            ports: { name: string; containerPort: number }[];
            resources: { requests: Record<string, unknown>; limits: Record<string, unknown> };
            readinessProbe: { httpGet: { path: string; port: string } };
            livenessProbe: { httpGet: { path: string; port: string } };
            startupProbe: { httpGet: { path: string } };
          }[];
        };
      };
    };
  };
  const service = parse(read("k8s/service.yaml")) as { kind: string; spec: { selector: Record<string, string>; ports: { targetPort: string }[] } };
  const secrets = parseAllDocuments(read("k8s/secret.example.yaml")).map((d) => d.toJS() as { kind: string; metadata: { name: string }; stringData: Record<string, string> });

  it("a Deployment with GPU requests, readiness on /readyz, liveness on /healthz, grace above the drain", () => {
    expect(deployment.kind).toBe("Deployment");
    expect(deployment.spec.replicas).toBe(2);
    const c = deployment.spec.template.spec.containers[0]!;
    expect(c.resources.requests["nvidia.com/gpu"]).toBe(1);
    expect(c.resources.limits["nvidia.com/gpu"]).toBe(1);
    expect(c.readinessProbe.httpGet.path).toBe("/readyz");
    expect(c.startupProbe.httpGet.path).toBe("/readyz");
    expect(c.livenessProbe.httpGet.path).toBe("/healthz");
    expect(c.ports.map((p) => p.name)).toContain(c.readinessProbe.httpGet.port);
    const env = Object.fromEntries(c.env.filter((e) => e.value !== undefined).map((e) => [e.name, e.value!]));
    expectKnownEnv(env, "k8s/deployment.yaml");
    expect(env.ASSAY_EXECUTION_PROVIDER).toBe("cuda");
    expect(deployment.spec.template.spec.terminationGracePeriodSeconds).toBeGreaterThan(Number(env.ASSAY_DRAIN_SECONDS));
    // Secret references name keys that the example Secret defines.
    for (const e of c.env.filter((x) => x.valueFrom)) {
      expect(configSource).toMatch(new RegExp(`\\b${e.name}:`));
      const ref = e.valueFrom!.secretKeyRef;
      expect(secrets.find((s) => s.metadata.name === ref.name)?.stringData[ref.key], `${ref.name}/${ref.key}`).toBeDefined();
    }
  });

  it("the Service selects the Deployment's pods and targets its named port", () => {
    expect(service.kind).toBe("Service");
    expect(deployment.spec.template.metadata.labels).toMatchObject(service.spec.selector);
    expect(deployment.spec.selector.matchLabels).toEqual(service.spec.selector);
    const ports = deployment.spec.template.spec.containers[0]!.ports.map((p) => p.name);
    for (const p of service.spec.ports) expect(ports).toContain(p.targetPort);
  });
});

describe("the routes the deployment relies on exist", () => {
  it("/readyz, /healthz and /metrics are registered", () => {
    const routes = fs.readFileSync(path.join(ROOT, "src", "http", "routes.ts"), "utf8") + fs.readFileSync(path.join(ROOT, "src", "http", "ops.ts"), "utf8");
    for (const r of ["/readyz", "/healthz", "/metrics"]) expect(routes).toContain(`"${r}"`);
  });
});
