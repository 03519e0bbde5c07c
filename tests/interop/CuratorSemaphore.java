// Interop peer for zkgate integration tests: drives an Apache Curator
// InterProcessSemaphoreV2 through a line protocol on stdin/stdout.
//
//   java -cp "$(tests/interop/classpath.sh)" CuratorSemaphore <connectString> <path> <maxLeases>
//
// stdout: READY once connected; ACQUIRED | TIMEOUT for "acquire <millis>"; RELEASED for
// "release" (gives back the one lease it holds); ERROR <message> on any exception.
// stdin: "acquire <millis>", "release", "quit" (EOF behaves like quit).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorSemaphore {
    private static PrintStream out;

    private static void say(String line) {
        out.println(line);
        out.flush();
    }

    public static void main(String[] args) throws Exception {
        out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        if (args.length != 3) {
            say("ERROR usage: CuratorSemaphore <connectString> <path> <maxLeases>");
            System.exit(1);
        }
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(10_000)
                .retryPolicy(new ExponentialBackoffRetry(200, 5))
                .build();
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            say("ERROR could not connect to " + args[0]);
            System.exit(1);
        }
        InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, args[1], Integer.parseInt(args[2]));
        Lease lease = null;
        say("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split("\\s+");
            try {
                switch (words[0]) {
                    case "acquire":
                        lease = semaphore.acquire(Long.parseLong(words[1]), TimeUnit.MILLISECONDS);
                        say(lease != null ? "ACQUIRED" : "TIMEOUT");
                        break;
                    case "release":
                        semaphore.returnLease(lease);
                        lease = null;
                        say("RELEASED");
                        break;
                    case "quit":
                        client.close();
                        return;
                    default:
                        say("ERROR unknown command: " + words[0]);
                }
            } catch (Exception e) {
                say("ERROR " + String.valueOf(e).replace('\n', ' '));
            }
        }
        client.close();
    }
}
