import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import Database from "better-sqlite3";
import { DB_FILE, SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { describeLedgerContract } from "./ledger-contract.js";

describeLedgerContract("SQLite", {
  async open(startingGrantMicro) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-ledger-"));
    const store = new SqliteAccountsStore(dir, { startingGrantMicro });
    return {
      store,
      async exec(sql) {
        const db = new Database(path.join(dir, DB_FILE));
        try {
          db.exec(sql);
        } finally {
          db.close();
        }
      },
      async close() {
        store.close();
        fs.rmSync(dir, { recursive: true, force: true });
      },
    };
  },
});
