// Baseline for bench/webhook_intake.py: Probot verifies X-Hub-Signature-256 and dispatches;
// the handlers only count. Install outside the repository (never commit node_modules):
//   npm install --prefix /tmp/gpuci-probot probot@14
// and run with APP_ID, PRIVATE_KEY, WEBHOOK_SECRET, PORT set:
//   /tmp/gpuci-probot/node_modules/.bin/probot run ./index.js
const counts = {};

module.exports = (app) => {
  app.onAny(async (context) => {
    const key = `${context.name}.${context.payload.action || "-"}`;
    counts[key] = (counts[key] || 0) + 1;
  });
  process.on("SIGTERM", () => {
    process.stderr.write(`probot-bench counts ${JSON.stringify(counts)}\n`);
    process.exit(0);
  });
};
